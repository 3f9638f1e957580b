"""Resolve vLLM's own convert, gather and writer from an installed vllm.

vLLM's functions have the exact public signatures of SPEC.md, so they plug in
unchanged. The older gather (before PR #48642) took ``seq_lens`` and no
``seq_starts``: it is wrapped to the new signature and marked as lacking the
``seq_starts`` capability, so the harness skips the cases that need it and says
so instead of reporting a false bug.
"""

from __future__ import annotations

import importlib
from typing import Callable

from mlafuzz.kernels.entry import ImplEntry, ImplError
from mlafuzz.kernels.external import adapt_signature

# (module, attribute) candidates, newest layout first.
CANDIDATES: dict[str, tuple[tuple[str, str], ...]] = {
    "convert": (
        ("vllm.v1.attention.backends.mla.flashmla_sparse", "triton_convert_req_index_to_global_index"),
        ("vllm.v1.attention.backends.mla.sparse_utils", "triton_convert_req_index_to_global_index"),
    ),
    "gather": (("vllm._custom_ops", "cp_gather_and_upconvert_fp8_kv_cache"),),
    "writer": (("vllm._custom_ops", "concat_and_cache_mla"),),
    # SPEC 9.4's DCP filter and its peer-slot variant (sparse_utils.py).
    "dcp": (("vllm.v1.attention.backends.mla.sparse_utils", "triton_filter_and_convert_dcp_index"),),
    "dcp_peer": (("vllm.v1.attention.backends.mla.sparse_utils", "convert_global_indices_to_dcp_peer_slots"),),
}


def _find(op: str) -> Callable:
    try:
        importlib.import_module("vllm")
    except ImportError:
        raise ImplError(
            f"--impl {op}=vllm: vllm is not installed in this environment"
            " (pip install vllm, or point --impl at module:attr)"
        ) from None
    tried = []
    for module, attr in CANDIDATES.get(op, ()):
        tried.append(f"{module}.{attr}")
        try:
            fn = getattr(importlib.import_module(module), attr, None)
        except ImportError:
            continue
        if callable(fn):
            return fn
    raise ImplError(f"--impl {op}=vllm: this vllm has no {op} implementation (looked for {', '.join(tried) or 'none'})")


def vllm_entry(op: str, *, rejects: frozenset[str]) -> ImplEntry:
    if op not in CANDIDATES:
        raise ImplError(f"--impl {op}=vllm: vllm has no implementation of op {op!r}")
    fn = _find(op)
    fn, caps = adapt_signature(op, fn)
    return ImplEntry(
        op=op,
        name="vllm",
        loader=lambda device: fn,
        devices=frozenset({"cuda"}),
        rejects=rejects,
        description=f"vLLM's {op}",
        capabilities=caps,
    )
