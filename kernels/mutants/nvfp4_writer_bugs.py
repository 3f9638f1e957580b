"""Planted bugs in the nvfp4_ds_mla writer (SPEC.md section 11.3): our torch writer
(kernels/nvfp4_writer_torch.py) with one rule of another source, judged under vLLM's CUDA
writer's revision ``rn_bump.mul_recip``. Each draws VALUE_MISMATCH on the CPU.

- ``no_bump``: the scale rounded to nearest only, the bump removed: FlashMLA #21 ("round the
  NVFP4 tile scale to nearest"), writer revision ``rn.mul_recip``.
- ``div``: the quotient ``x / sf`` of the references (FlashMLA ``tests/quant.py`` @29b0d03c) for
  vLLM's reciprocal multiply, writer revision ``rn_bump.div``: it differs on exact e2m1 ties only,
  which a quarter to a third of normal tokens hold.
- ``rope_unsaturated``: RoPE cast to e4m3 without saturating: a value of 464 or more becomes NaN
  (0x7F), as torch's float8 cast did before it saturated and PTX's cvt without ``.satfinite``.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from mlafuzz.kernels.checks import WRITER_TORCH_REJECTS
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.nvfp4_writer_torch import FORMAT, writer_nvfp4_torch

__all__ = ["NVFP4_WRITER_MUTANTS"]

_UNSATURATED = 464.0  # the midpoint past 448: round-to-nearest without saturation overflows there


def _rope_unsaturated(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="nvfp4_ds_mla", scale=None) -> None:
    writer_nvfp4_torch(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    slots = slot_mapping.long()
    tok = torch.nonzero(slots >= 0).reshape(-1)
    if tok.numel():
        rope = FORMAT.plane("rope")
        rows = kv_cache.view(torch.uint8).view(-1, FORMAT.record_bytes)
        over = k_pe[tok].float().abs() >= _UNSATURATED
        block = rows[slots[tok], rope.offset : rope.stop]
        rows[slots[tok], rope.offset : rope.stop] = torch.where(over, torch.full_like(block, 0x7F), block)


_BUGS: dict[str, tuple[Callable, str]] = {
    "no_bump": (
        functools.partial(writer_nvfp4_torch, revision="rn.mul_recip"),
        "the tile scale rounded to nearest, the bump removed (FlashMLA #21's rule, not vLLM's)",
    ),
    "div": (
        functools.partial(writer_nvfp4_torch, revision="rn_bump.div"),
        "x / sf (the references') for vLLM's x * (1 / sf): differs on exact e2m1 ties",
    ),
    "rope_unsaturated": (_rope_unsaturated, "RoPE cast to e4m3 without saturating: 464 and above become NaN"),
}


def _loader(fn: Callable) -> Callable[[str], Callable]:
    return lambda device: fn


NVFP4_WRITER_MUTANTS: tuple[ImplEntry, ...] = tuple(
    ImplEntry(
        op="nvfp4_writer",
        name=f"nvfp4_writer_{bug}",
        loader=_loader(fn),
        devices=frozenset({"cpu", "cuda"}),
        rejects=WRITER_TORCH_REJECTS,
        description=text,
        expected_kind="VALUE_MISMATCH",
        is_mutant=True,
        group="nvfp4",
    )
    for bug, (fn, text) in _BUGS.items()
)
