"""nvfp4_ds_mla cache records (SPEC.md section 11.1), hashed byte by byte on the device.

Every record byte comes from the hash stream of its cache (``Stream``, keyed by the case's seed
and the stream's name), so a record depends only on (seed, stream, its index) and is the same on
every device. Unlike fp8_ds_mla's pooled records (records.py), nothing here is pooled: an nvfp4
record has no structure a pool would save work on (every byte of its NoPE and RoPE planes is a
valid input as drawn).

- NoPE bytes ``[0, 256)``: uniform, so every e2m1 code (all 16 are finite) in both nibbles.
- RoPE bytes ``[256, 320)``: uniform, all 256 e4m3 bytes (NaN 0x7F / 0xFF included: the reader
  turns them into a bf16 NaN; the comparator holds NaN positions).
- Scale bytes ``[320, 352)``: ``written`` draws 0x01..0x7E, the bytes a writer emits, where the
  exact reader's product is exact and the readers agree bit for bit. ``unwritten`` replaces about
  a quarter of them with bytes no writer emits (0x00, 0x7F, 0xFF, 0x80..0xFE), the tagged class
  where only NaN-ness and sign are contract (``oracles.formats.nvfp4_read.loose_mask``).
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from mlafuzz.generators.rng.bits import Device
from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.records import zeros
from mlafuzz.oracles.formats.table import get

__all__ = ["Nvfp4Values", "FORMAT", "nvfp4_cache"]

FORMAT = get("nvfp4_ds_mla")
_SCALE = FORMAT.plane("scale")
_WRITTEN_SCALES = 0x7E  # 0x01..0x7E


class Nvfp4Values(str, enum.Enum):
    """What an nvfp4_ds_mla cache's scale bytes hold (SPEC 11.2)."""

    WRITTEN = "written"  # only bytes a writer emits (0x01..0x7E): judged bit for bit
    UNWRITTEN = "unwritten"  # a share of 0x00 / NaN / negative scales: judged on NaN-ness and sign


def _scales(stream: Stream, raw: Tensor, values: Nvfp4Values) -> Tensor:
    """Scale bytes [n, 32] from the record's raw bytes there (and, for unwritten, a second stream)."""
    written = (raw.to(torch.int32) % _WRITTEN_SCALES + 1).to(torch.uint8)
    if values is Nvfp4Values.WRITTEN:
        return written
    w = stream.child("loose").words(raw.shape, device=raw.device)
    loose = (w & 3) == 0
    kind = (w >> 2) & 3  # 0x00, NaN 0x7F, NaN 0xFF, a negative byte (0x80 | the raw byte)
    table = torch.tensor([0x00, 0x7F, 0xFF, 0x80], dtype=torch.int32, device=raw.device)
    other = table[kind] | torch.where(kind == 3, raw.to(torch.int32) & 0x7F, 0)
    return torch.where(loose, other.to(torch.uint8), written)


def nvfp4_cache(
    stream: Stream,
    values: Nvfp4Values,
    *,
    pool_blocks: int,
    block_size: int,
    base_block: int = 0,
    device: Device,
) -> Tensor:
    """A paged nvfp4_ds_mla cache, uint8 ``[base_block + pool_blocks, block_size, 352]``: blocks
    below base_block all zero (allocated lazily, never read by a valid call), then pool_blocks
    blocks of drawn records, record i of them from bytes ``[352 i, 352 (i + 1))`` of ``stream``."""
    nbytes = FORMAT.record_bytes
    shape = (base_block + pool_blocks, block_size, nbytes)
    cache = (
        zeros(shape, dtype=torch.uint8, device=device)
        if base_block
        else torch.empty(shape, dtype=torch.uint8, device=device)
    )
    n = pool_blocks * block_size
    if n:
        raw = stream.bytes(n * nbytes, device=device).view(n, nbytes)
        raw[:, _SCALE.offset : _SCALE.stop] = _scales(stream, raw[:, _SCALE.offset : _SCALE.stop], Nvfp4Values(values))
        cache[base_block:].view(n, nbytes).copy_(raw)
    return cache
