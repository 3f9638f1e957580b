"""Implementations outside the project: ``--impl OP=package.module:attr`` or ``OP=path/to/file.py:attr``.

The callable is imported when it is resolved, so a mistake surfaces as one
line before any case runs; its signature says which optional SPEC features it
has (``adapt_signature``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

from mlafuzz.kernels.entry import ImplEntry, ImplError


def _check_callable(obj: object, ref: str) -> Callable:
    if not callable(obj):
        raise ImplError(f"--impl {ref}: {type(obj).__name__} object is not callable")
    return obj  # type: ignore[return-value]


def _load_from_path(path_text: str, attr: str, ref: str) -> Callable:
    path = Path(path_text)
    if not path.is_file():
        raise ImplError(f"--impl {ref}: file {path_text!r} does not exist")
    mod_name = f"mlafuzz_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImplError(f"--impl {ref}: {path_text!r} is not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # spawned workers re-resolve by path, not by this name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed to import: say how, in one line
        raise ImplError(f"--impl {ref}: importing {path_text!r} failed: {type(exc).__name__}: {exc}") from None
    if not hasattr(module, attr):
        raise ImplError(f"--impl {ref}: {path_text!r} has no attribute {attr!r}")
    return _check_callable(getattr(module, attr), ref)


def _load_from_module(module_name: str, attr: str, ref: str) -> Callable:
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ImplError(f"--impl {ref}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplError(f"--impl {ref}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return _check_callable(obj, ref)


def external_entry(op: str, ref: str, *, rejects: Iterable[str]) -> ImplEntry:
    """An entry for ``module:attr`` or ``path.py:attr``, loaded now so errors surface early."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ImplError(f"--impl {op}={ref}: expected a registered name, 'vllm', 'module:attr' or 'path.py:attr'")
    is_path = target.endswith(".py") or "/" in target or os.sep in target
    fn = _load_from_path(target, attr, ref) if is_path else _load_from_module(target, attr, ref)
    fn, caps = adapt_signature(op, fn)
    return ImplEntry(
        op=op,
        name=ref,
        loader=lambda device: fn,
        devices=frozenset({"cpu", "cuda"}),
        rejects=frozenset(rejects),
        description=f"external implementation {ref}",
        capabilities=caps,
    )


# Optional convert features (SPEC section 7) by the keyword that carries them, as vLLM spells it.
CONVERT_OPTION_KEYWORDS = {"BLOCK_STRIDE_ROWS": "block_stride_rows", "COMPACT_TO_FRONT": "compact_to_front"}
GATHER_HOST_KEYWORDS = ("host_cache", "host_row_ids", "device_row_ids")  # the ``host_tier`` capability
# SPEC 9.2's caller-owned outputs: a signature that names both keywords (vLLM's convert, and its
# DCP peer-slot variant) gets them in some cases.
CALLER_OUT_KEYWORDS = ("out", "valid_counts_out")


# SPEC 10: vLLM's releases' convert arguments. ``idx_mapping`` (0.33.0) by its name; ``dcp_args``
# (0.30.0) when all four DCP keywords are named (vLLM passes them together).
DCP_ARG_KEYWORDS = ("dcp_size", "dcp_rank", "cp_kv_cache_interleave_size", "prefill_workspace_rank_stride")


def release_args(params: object) -> frozenset[str]:
    """``idx_mapping`` / ``dcp_args`` as a convert's signature names their keywords."""
    if not params:
        return frozenset()
    return frozenset({"idx_mapping"} if "idx_mapping" in params else ()) | frozenset(
        {"dcp_args"} if all(k in params for k in DCP_ARG_KEYWORDS) else ()
    )


def caller_out(params: object) -> frozenset[str]:
    """``{"caller_out"}`` when a signature's parameters name ``out`` and ``valid_counts_out``."""
    return frozenset({"caller_out"}) if params and all(k in params for k in CALLER_OUT_KEYWORDS) else frozenset()


def adapt_signature(op: str, fn: Callable) -> tuple[Callable, frozenset[str]]:
    """Fit an external callable to SPEC's signature and say which optional features it has.

    A gather with ``seq_lens`` and no ``seq_starts`` (the pre-#48642 signature)
    is wrapped to the new call and lacks the ``seq_starts`` capability: cases
    that need it are skipped and reported, not failed. A gather that names ``host_cache``,
    ``host_row_ids`` and ``device_row_ids`` has the ``host_tier`` capability (SPEC 9.3). A convert has the
    ``block_stride_rows`` / ``compact_to_front`` capability when its signature
    names ``BLOCK_STRIDE_ROWS`` / ``COMPACT_TO_FRONT`` (a ``**kwargs`` proves
    nothing: it may drop them); the harness passes those keywords only to
    implementations that have them, so an older convert is called as before. Likewise
    ``caller_out`` (SPEC 9.2) when it names ``out`` and ``valid_counts_out``.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and torch ops may hide their signature
        params = None
    if op == "convert":
        named = frozenset(CONVERT_OPTION_KEYWORDS[p] for p in (params or ()) if p in CONVERT_OPTION_KEYWORDS)
        return fn, named | caller_out(params) | release_args(params)
    if op == "dcp_peer":  # SPEC 9.4's peer-slot map takes SPEC 9.2's caller-owned outputs too
        return fn, caller_out(params)
    if op != "gather" or params is None:
        return fn, frozenset({"seq_starts"})
    if "seq_starts" not in params and "seq_lens" in params:
        return adapt_old_gather(fn), frozenset()
    # SPEC 9.3's host tier: a gather that names all three keywords (vLLM's after HiSparse).
    host = frozenset({"host_tier"}) if all(k in params for k in GATHER_HOST_KEYWORDS) else frozenset()
    return fn, frozenset({"seq_starts"}) | host


def adapt_old_gather(fn: Callable) -> Callable:
    """Wrap gather(src, dst, block_table, seq_lens, workspace_starts, batch_size) to the new signature."""

    def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
        import torch

        ws = workspace_starts[:batch_size].to(torch.int64)
        ends = torch.cat([ws[1:], ws.new_tensor([dst.shape[0]])])
        seq_lens = (ends - ws).to(torch.int32)
        return fn(src_cache, dst, block_table, seq_lens, workspace_starts, batch_size)

    return gather
