"""Planted bugs in the nvfp4_ds_mla upconvert gather (SPEC.md section 11): torch variants of our
gather (kernels/nvfp4/torch_gather.py), each a realistic misreading of the 352-byte record, so they run
anywhere and the catalog is scored on the CPU. Each draws VALUE_MISMATCH on written records.

- ``identity_scales``: block s's scale read at byte 320 + s, FlashMLA's permuted layout
  (``320 + 8 * (s & 3) + (s >> 2)``, vllm-project/FlashMLA ``nvfp4_head64/config.h`` @29b0d03c)
  taken for the plain order.
- ``swapped_nibbles``: the high nibble read as the even element (the low one is: docs/contract.md, Cache formats).
- ``fp8_stride``: records addressed with fp8_ds_mla's 656-byte stride, as a kernel that keeps the
  fp8 gather's record size (the bytes past the cache's end wrap around here, where a kernel would
  read past it).
- ``staging_clip``: each product clipped to +-448 as the FP8 staging gather (vLLM's
  ``nvfp4_ds_mla_fp8_gather.py`` @6e0ea942fd) must, where the bf16 upconvert must not: a scale
  above 74.67 with code 6 saturates.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from mlafuzz.kernels.builtins import NVFP4_GATHER_TORCH_REJECTS
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.nvfp4.torch_gather import E2M1_VALUES, FORMAT, record_slots
from mlafuzz.oracles.formats.table import get

__all__ = ["NVFP4_MUTANTS"]

_FP8_RECORD_BYTES = get("fp8_ds_mla").record_bytes
_CLIP = 448.0


def _records(bug: str, src_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    flat = src_cache.view(torch.uint8).reshape(-1)
    stride = _FP8_RECORD_BYTES if bug == "fp8_stride" else FORMAT.record_bytes
    idx = slots[:, None] * stride + torch.arange(FORMAT.record_bytes, device=slots.device)
    return flat[idx % flat.numel()]


def _upconvert(bug: str, records: torch.Tensor) -> torch.Tensor:
    nope, scale, rope = (FORMAT.plane(p) for p in ("nope", "scale", "rope"))
    packed = records[:, nope.offset : nope.stop].to(torch.int64)
    even, odd = (packed >> 4, packed & 0xF) if bug == "swapped_nibbles" else (packed & 0xF, packed >> 4)
    codes = torch.stack([even, odd], dim=-1).reshape(-1, nope.elements)
    order = range(FORMAT.scales) if bug == "identity_scales" else FORMAT.scale_slots
    slots = torch.tensor(list(order), dtype=torch.int64, device=records.device)
    scales = records[:, scale.offset : scale.stop][:, slots].contiguous().view(torch.float8_e4m3fn).float()
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=records.device)
    values = table[codes] * scales.repeat_interleave(FORMAT.scale_block, dim=-1)
    if bug == "staging_clip":
        values = values.clamp(-_CLIP, _CLIP)
    rope_values = records[:, rope.offset : rope.stop].contiguous().view(torch.float8_e4m3fn).float()
    return torch.cat([values, rope_values], dim=-1).to(torch.bfloat16)


def _gather(
    bug: str,
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    slots = record_slots(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    if slots.numel():
        dst.copy_(_upconvert(bug, _records(bug, src_cache, slots)))


_BUGS = {
    "identity_scales": "block s's scale read at byte 320 + s: FlashMLA's permuted scale layout ignored",
    "swapped_nibbles": "the high nibble read as the even element (the low one is: docs/contract.md, Cache formats)",
    "fp8_stride": "records addressed with fp8_ds_mla's 656-byte stride, not 352",
    "staging_clip": "products clipped to +-448 like the FP8 staging gather; the bf16 upconvert must not clip",
}


def _loader(bug: str) -> Callable[[str], Callable]:
    return lambda device: functools.partial(_gather, bug)


NVFP4_MUTANTS: tuple[ImplEntry, ...] = tuple(
    ImplEntry(
        op="nvfp4_gather",
        name=f"nvfp4_gather_{bug}",
        loader=_loader(bug),
        devices=frozenset({"cpu", "cuda"}),
        rejects=NVFP4_GATHER_TORCH_REJECTS,
        description=text,
        expected_kind="VALUE_MISMATCH",
        is_mutant=True,
        group="nvfp4",
    )
    for bug, text in _BUGS.items()
)
