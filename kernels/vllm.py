"""Resolve vLLM's own convert, gather, writer and packing chunk planner from an installed vllm.

vLLM's functions have the exact public signatures of SPEC.md, so they plug in
unchanged. The older gather (before PR #48642) took ``seq_lens`` and no
``seq_starts``: it is wrapped to the new signature and marked as lacking the
``seq_starts`` capability, so the harness skips the cases that need it and says
so instead of reporting a false bug.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable

from mlafuzz.kernels.entry import ImplEntry, ImplError
from mlafuzz.kernels.external import adapt_signature, opaque

VERSION_VARIABLE = "MLAFUZZ_VLLM_VERSION"  # names the vLLM release; wins over the installed one


def installed_version(environ: dict[str, str] | None = None) -> str:
    """The vLLM release ``--revision auto`` follows: MLAFUZZ_VLLM_VERSION when set (a user's word,
    or a tree built from a wheel), else the importable vllm's ``__version__``. ImplError (one line)
    when neither says."""
    env = os.environ if environ is None else environ
    given = env.get(VERSION_VARIABLE, "").strip()
    if given:
        return given
    try:
        module = importlib.import_module("vllm")
    except ImportError:
        raise ImplError(
            f"vllm is not installed in this environment; set {VERSION_VARIABLE}=X.Y.Z"
            " or name a revision with --revision"
        ) from None
    version = getattr(module, "__version__", None)
    if not isinstance(version, str) or not version.strip():
        raise ImplError(f"this vllm has no __version__; set {VERSION_VARIABLE}=X.Y.Z")
    return version.strip()


def _find(op: str, candidates: tuple[tuple[str, str], ...]) -> Callable:
    try:
        importlib.import_module("vllm")
    except ImportError:
        raise ImplError(
            f"--impl {op}=vllm: vllm is not installed in this environment"
            " (pip install vllm, or point --impl at module:attr)"
        ) from None
    tried = []
    for module, attr in candidates:
        tried.append(f"{module}.{attr}")
        try:
            fn = getattr(importlib.import_module(module), attr, None)
        except ImportError:
            continue
        if callable(fn):
            return fn
    raise ImplError(f"--impl {op}=vllm: this vllm has no {op} implementation (looked for {', '.join(tried) or 'none'})")


def vllm_entry(
    op: str,
    *,
    rejects: frozenset[str],
    candidates: tuple[tuple[str, str], ...],
    devices: frozenset[str] = frozenset({"cuda"}),
) -> ImplEntry:
    """``candidates``: where vLLM keeps the op, as (module, attribute), newest layout first (the op
    table's row says; none: vLLM has no implementation of it); ``devices``: where it runs (CUDA
    kernels; a pure Python one such as the chunk planner anywhere)."""
    if not candidates:
        raise ImplError(f"--impl {op}=vllm: vllm has no implementation of op {op!r}")
    fn = _find(op, candidates)
    fn, caps = adapt_signature(op, fn)
    return ImplEntry(
        op=op,
        name="vllm",
        loader=lambda device: fn,
        devices=devices,
        rejects=rejects,
        description=f"vLLM's {op}",
        capabilities=caps,
        surfaces_from="opaque" if opaque(fn) else "signature",
    )
