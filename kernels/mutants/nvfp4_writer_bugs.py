"""Planted bugs in the nvfp4_ds_mla writer (SPEC.md section 11.3): our torch writer
(kernels/nvfp4/torch_writer.py) with one rule of another source, judged under vLLM's CUDA
writer's revision ``rn_bump.mul_recip`` unless it names another (its cases drawn under it, as
``fuzz --nvfp4-writer`` draws them). Each draws VALUE_MISMATCH on the CPU.

- ``no_bump``: the scale rounded to nearest only, the bump removed: FlashMLA #21 ("round the
  NVFP4 tile scale to nearest"), writer revision ``rn.mul_recip``.
- ``div``: the quotient ``x / sf`` of the references (FlashMLA ``tests/quant.py`` @29b0d03c) for
  vLLM's reciprocal multiply, writer revision ``rn_bump.div``: it differs on exact e2m1 ties only,
  which a quarter to a third of normal tokens hold.
- ``bump_added``: vLLM's bumped scale where the rule is nearest (FlashMLA #21's), judged under
  ``rn.mul_recip``: a writer that kept the bump after upstream dropped it.
- ``mul_recip``: vLLM's reciprocal multiply where the rule is the references' division (judged
  under ``rn_bump.div``): the other direction of ``div``, seen on exact ties only.
- ``identity_scales``: block s's scale written at byte 320 + s, FlashMLA's 8x4 transposed scale
  layout (``nvfp4_head64/config.h`` @29b0d03c) taken for the plain order; the gather mutant of
  the same name reads so.
- ``swapped_nibbles``: the even element packed in the high nibble (the low one holds it:
  docs/contract.md, Cache formats).
- ``fp8_stride``: records placed at fp8_ds_mla's 656-byte stride (a writer that keeps the fp8
  writer's record size; bytes past the cache's end wrap around here, where a kernel would write
  out of bounds).
- ``rope_unsaturated``: RoPE cast to e4m3 without saturating: a value of 464 or more becomes NaN
  (0x7F), as torch's float8 cast did before it saturated and PTX's cvt without ``.satfinite``.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from mlafuzz.kernels.checks import WRITER_TORCH_REJECTS
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.nvfp4.torch_writer import FORMAT, encode_records, writer_nvfp4_torch
from mlafuzz.oracles.formats.table import get

__all__ = ["NVFP4_WRITER_MUTANTS"]

_FP8_RECORD_BYTES = get("fp8_ds_mla").record_bytes
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


def _misplaced(bug: str, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="nvfp4_ds_mla", scale=None) -> None:
    """The torch writer's records with one layout slip (``bug``), written where the slip puts them."""
    writer_nvfp4_torch(kv_c, k_pe, kv_cache.clone(), slot_mapping, kv_cache_dtype, scale)  # its refusals
    slots = slot_mapping.long()
    tok = torch.nonzero(slots >= 0).reshape(-1)
    if tok.numel() == 0:
        return
    rec = encode_records(kv_c[tok], k_pe[tok])
    nope, scale_plane = FORMAT.plane("nope"), FORMAT.plane("scale")
    if bug == "identity_scales":  # block s's scale (at its permuted byte) moved to byte s
        placed = torch.tensor(FORMAT.scale_slots, dtype=torch.int64) + scale_plane.offset
        rec[:, scale_plane.offset : scale_plane.stop] = rec[:, placed]
    if bug == "swapped_nibbles":
        b = rec[:, nope.offset : nope.stop]
        rec[:, nope.offset : nope.stop] = (b << 4) | (b >> 4)
    flat = kv_cache.view(torch.uint8).reshape(-1)
    stride = _FP8_RECORD_BYTES if bug == "fp8_stride" else FORMAT.record_bytes
    idx = (slots[tok][:, None] * stride + torch.arange(FORMAT.record_bytes, device=flat.device)) % flat.numel()
    # Wrapped records may overlap: the later token's byte wins, deterministically (index_put with
    # repeated indices is unordered), so the bug is a wrong place, not a race.
    where, inverse = torch.unique(idx.reshape(-1), return_inverse=True)
    order = torch.arange(inverse.numel(), device=flat.device)
    last = torch.full_like(where, -1).scatter_reduce(0, inverse, order, reduce="amax")
    flat[where] = rec.reshape(-1)[last]


_BUGS: dict[str, tuple[Callable, str]] = {
    "no_bump": (
        functools.partial(writer_nvfp4_torch, revision="rn.mul_recip"),
        "the tile scale rounded to nearest, the bump removed (FlashMLA #21's rule, not vLLM's)",
    ),
    "div": (
        functools.partial(writer_nvfp4_torch, revision="rn_bump.div"),
        "x / sf (the references') for vLLM's x * (1 / sf): differs on exact e2m1 ties",
    ),
    "bump_added": (
        writer_nvfp4_torch,
        "the tile scale bumped (vLLM's rule) where the revision rounds to nearest (FlashMLA #21's)",
    ),
    "mul_recip": (
        writer_nvfp4_torch,
        "x * (1 / sf) (vLLM's) where the revision divides (the references'): differs on exact e2m1 ties",
    ),
    "identity_scales": (
        functools.partial(_misplaced, "identity_scales"),
        "block s's scale written at byte 320 + s: FlashMLA's permuted scale layout ignored",
    ),
    "swapped_nibbles": (
        functools.partial(_misplaced, "swapped_nibbles"),
        "the even element packed in the high nibble (the low one holds it: docs/contract.md, Cache formats)",
    ),
    "fp8_stride": (functools.partial(_misplaced, "fp8_stride"), "records written at fp8_ds_mla's 656-byte stride"),
    "rope_unsaturated": (_rope_unsaturated, "RoPE cast to e4m3 without saturating: 464 and above become NaN"),
}


#: The writer revision a mutant is judged under where it is not vLLM's (its cases drawn so).
_JUDGED_UNDER = {"bump_added": "rn.mul_recip", "mul_recip": "rn_bump.div"}


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
        draws=(("nvfp4_writer", _JUDGED_UNDER[bug]),) if bug in _JUDGED_UNDER else (),
    )
    for bug, (fn, text) in _BUGS.items()
)
