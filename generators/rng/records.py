"""fp8_ds_mla cache records (SPEC section 2), one builder per ValueMode, made on the device.

Speed: hashing every byte of a 100+ MB cache is too slow on a GPU, so each
mode has a POOL of P = 1024 distinct records, made exactly (element by
element from the hash stream ``mlafuzz/records/<mode>``) once per process on
the CPU and copied to each device it is used on: the same bytes in every
process and on every device. Record s of a cache is then

    codes of pool[sel(s)], rope of pool[rope(s)], its four scales a row of the mode's scale table:

three row gathers per record, about one pass over the cache's bytes, written
straight into the cache tensor (about ten device ops whatever its size). sel,
rope and the scale row come from two 31-bit words per record: the words of
block b are one window of the word table (pool.py) at the offset its block
word gives, so a record depends only on (the case's stream, its block, its
entry). The scale tables (2**16 rows of four per mode; for activations 64 per
pool row) are made on the CPU once per process too.

What each record owns beyond its two pool rows (the rope of an activations
record is still a writer output: the writer copies k_pe whatever kv_c is):

- activations: a power-of-two shift 2**k, k in [-20, 20], of each non-zero
  tile's scale (one of 64 shift rows per pool row). The pool rows are the writer oracle's output for normal-like
  bf16 inputs, so a shifted record is exactly what the writer makes of the
  input scaled by 2**k (amax and scale scale exactly, the codes are the same).
- all_codes: four random scales, exponent in [-24, 24] and a random 23-bit
  mantissa; every pool row holds two permutations of 0..255, so EVERY record
  holds every code (twice).
- extreme_scales / subnormal: each tile's scale picked from the catalog
  (14 / 6 values); codes random, never NaN.
- nan: random scales (exponent in [-12, 12]), NaN / +inf / -inf for a tile
  with probability 3/16; pool codes NaN with probability 1/8, pool rope
  NaN/inf/subnormal patterns with probability ~1/6.

Distinctness. Two records are byte-equal only if they picked the same codes
row and the same rope row (1/1024 each) and the same scale row (1/65536; for
activations, 1/64 once the codes row is the same): at most 2**-26 for a given
pair. A kernel that reads the wrong record, block or tile therefore sees a
different row with probability > 1 - 2**-26 per wrong read (the rope alone
differs with probability 1 - 1/1024). Not guaranteed: that a given pair
differs, and in the subnormal mode that the *dequantized* nope parts differ.
"""

from __future__ import annotations

import functools
import mmap
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from mlafuzz.generators import catalog
from mlafuzz.generators.rng.bits import BF16, Device, const, f32_pattern, normal_bits, pick, to_half
from mlafuzz.generators.rng.fusing import fused_room
from mlafuzz.generators.rng.hashing import Stream, as_int32
from mlafuzz.generators.rng.pool import (
    POOL_WORDS,
    Draws,
    device_name,
    window_width,
    windows,
    word_pool,
)
from mlafuzz.generators.spec import ValueMode
from mlafuzz.oracles.codec import encode_rows
from mlafuzz.oracles.formats import table as formats

__all__ = [
    "POOL_RECORDS",
    "RECORD_BYTES",
    "WORDS",
    "LAZY_BYTES",
    "record_pool",
    "scale_rows",
    "fill_records",
    "record_words",
    "paged_cache",
    "zeros",
]

# The record's layout: fp8_ds_mla's row of the format table (the pools below are its codecs'
# values: e4m3fn codes, f32 tile scales, bf16 RoPE).
FORMAT = formats.get("fp8_ds_mla")
RECORD_BYTES = FORMAT.record_bytes
_NOPE = FORMAT.plane("nope")
_SCALE = FORMAT.plane("scale")
_ROPE_PLANE = FORMAT.plane("rope")
POOL_RECORDS = 1024
_SCALES = slice(_SCALE.offset, _SCALE.stop)
_ROPE = slice(_ROPE_PLANE.offset, _ROPE_PLANE.stop)
_FLT_MIN_BITS = 0x0080_0000

_EXTREME_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.EXTREME_SCALES)
_SUBNORMAL_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.SUBNORMAL_SCALES)
_NONFINITE_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.NONFINITE_SCALES)


def _rope_bytes(bits: Tensor) -> Tensor:
    return to_half(bits, torch.bfloat16).view(torch.uint8).reshape(bits.shape[0], _ROPE_PLANE.nbytes)


def _from_parts(codes: Tensor, rope_bits: Tensor) -> Tensor:
    """Pool records from codes (uint8 [P, 512]) and rope patterns; scales are per record."""
    zeros = torch.zeros((codes.shape[0], _SCALE.nbytes), dtype=torch.uint8, device=codes.device)
    return torch.cat([codes, zeros, _rope_bytes(rope_bits)], dim=1)


def _finite_rope(stream: Stream) -> Tensor:
    return normal_bits(stream.child("rope").words((POOL_RECORDS, _ROPE_PLANE.elements), device="cpu"), BF16)


def _random_codes(stream: Stream) -> Tensor:
    """Uniform codes with the two NaN codes moved to their neighbours 0x7E / 0xFE."""
    codes = stream.child("codes").bytes(POOL_RECORDS * _NOPE.nbytes, device="cpu").reshape(POOL_RECORDS, _NOPE.nbytes)
    return torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)


# --- pools (on the CPU: the exact reference bytes, copied to each device) ----------


def _activations_pool(stream: Stream) -> Tensor:
    w = stream.child("kv_c").words((POOL_RECORDS, FORMAT.scales, FORMAT.scale_block), device="cpu")
    bits = normal_bits(w, BF16)
    zero_tile = stream.child("zero_tile").coin(
        1, 16, (POOL_RECORDS, FORMAT.scales, 1), device="cpu"
    )  # -> scale FLT_MIN
    bits = bits.masked_fill(zero_tile, 0).reshape(POOL_RECORDS, FORMAT.nope_dim)
    k_pe = to_half(_finite_rope(stream), torch.bfloat16)
    # 2026-07 records: unrounded scales, so a gather's f32 multiply rounds (a power of two never would).
    return encode_rows(kv_c=to_half(bits, torch.bfloat16), k_pe=k_pe, revision="2026-07")


def _all_codes_pool(stream: Stream) -> Tensor:
    perms = stream.child("codes").permutation(256, batch=(POOL_RECORDS, 2), device="cpu")
    return _from_parts(perms.reshape(POOL_RECORDS, _NOPE.nbytes).to(torch.uint8), _finite_rope(stream))


def _plain_pool(stream: Stream) -> Tensor:
    return _from_parts(_random_codes(stream), _finite_rope(stream))


def _nan_pool(stream: Stream) -> Tensor:
    w = stream.child("codes").words((POOL_RECORDS, _NOPE.nbytes), device="cpu")
    nan_code = 0x7F | (((w >> 11) & 1) << 7)  # 0x7F or 0xFF
    codes = torch.where(((w >> 8) & 7) == 0, nan_code, w & 0xFF).to(torch.uint8)
    rw = stream.child("rope").words((POOL_RECORDS, _ROPE_PLANE.elements), device="cpu")
    specials = const(catalog.ROPE_SPECIAL_BITS, "cpu")
    special = specials[pick((rw >> 10) & 63, 6, len(catalog.ROPE_SPECIAL_BITS))]
    rope = torch.where(pick((rw >> 24) & 0x7F, 7, 6) == 0, special, normal_bits(rw, BF16))
    return _from_parts(codes, rope)


# --- scale rows: a record's four scales are one row of its mode's table -------------
# Made on the CPU from 32-bit hash words (exact int64 math), int32 f32 patterns [rows, 4]. One row
# per record keeps a record's scales to one gather on the device (the per-tile fields of the old
# scheme cost a dozen ops per case); 2**16 rows per mode, 64 per pool row for activations.

SCALE_ROWS = 1 << 16
ACT_VARIANTS = 64
_BYTE_SHIFTS = (0, 8, 16, 24)


def _tile_bytes(word: Tensor) -> Tensor:
    """[n] 32-bit words -> [n, 4] bytes (one random byte per tile)."""
    return (word.unsqueeze(-1) >> const(_BYTE_SHIFTS, "cpu")) & 0xFF


def _random_scales(w: Tensor, *, exp_lo: int, exp_hi: int) -> Tensor:
    """Positive normal f32 patterns: exponent uniform in [exp_lo, exp_hi] (bits 23..27 pick it), a
    random 23-bit mantissa."""
    exp = pick((w >> 23) & 31, 5, exp_hi - exp_lo + 1) + exp_lo
    return ((exp + 127) << 23) | (w & 0x7F_FFFF)


def _activations_rows(stream: Stream, pool: Tensor) -> Tensor:
    """Row sel * 64 + v: pool row sel's scales, each non-zero tile's shifted by 2**k, k in [-20, 20]."""
    base = pool[:, _SCALES].contiguous().view(torch.int32).to(torch.int64).repeat_interleave(ACT_VARIANTS, dim=0)
    shift = pick(_tile_bytes(stream.words(POOL_RECORDS * ACT_VARIANTS, device="cpu")), 8, 41) - 20
    return torch.where(base == _FLT_MIN_BITS, base, base + shift * (1 << 23))


def _all_codes_rows(stream: Stream, pool: Tensor) -> Tensor:
    # 5 bits spread [-24, 24] in steps of ~1.5 binades: enough.
    return _random_scales(stream.words((SCALE_ROWS, 4), device="cpu"), exp_lo=-24, exp_hi=24)


def _catalog_rows(table: tuple[int, ...]) -> Callable[[Stream, Tensor], Tensor]:
    def rows(stream: Stream, pool: Tensor) -> Tensor:
        picks = pick(_tile_bytes(stream.words(SCALE_ROWS, device="cpu")), 8, len(table))
        return const(table, "cpu")[picks] & 0xFFFF_FFFF  # signed int32 patterns -> [0, 2**32)

    return rows


def _nan_rows(stream: Stream, pool: Tensor) -> Tensor:
    w = stream.words((SCALE_ROWS, 4), device="cpu")
    finite = _random_scales(w, exp_lo=-12, exp_hi=12)
    which = w >> 28  # 4 bits: 0, 1, 2 -> NaN, +inf, -inf (probability 3/16)
    special = const(_NONFINITE_SCALE_BITS + (0,), "cpu")[torch.clamp(which, max=3)] & 0xFFFF_FFFF
    return torch.where(which < 3, special, finite)


@dataclass(frozen=True)
class _Mode:
    pool: Callable[[Stream], Tensor]
    scale_rows: Callable[[Stream, Tensor], Tensor]


_MODES: dict[ValueMode, _Mode] = {
    ValueMode.ACTIVATIONS: _Mode(_activations_pool, _activations_rows),
    ValueMode.ALL_CODES: _Mode(_all_codes_pool, _all_codes_rows),
    ValueMode.EXTREME_SCALES: _Mode(_plain_pool, _catalog_rows(_EXTREME_SCALE_BITS)),
    ValueMode.SUBNORMAL: _Mode(_plain_pool, _catalog_rows(_SUBNORMAL_SCALE_BITS)),
    ValueMode.NAN: _Mode(_nan_pool, _nan_rows),
}
WORDS = 2  # per record: the pool rows' pick, the scale row's


@functools.lru_cache(maxsize=32)
def _pool(mode: ValueMode, device: str) -> tuple[Tensor, Tensor, Tensor]:
    stream = Stream(0, f"mlafuzz/records/{mode.value}")
    cpu = _MODES[mode].pool(stream)
    rope = cpu[:, _ROPE].contiguous()
    scales = as_int32(_MODES[mode].scale_rows(stream.child("scales"), cpu))
    return cpu.to(device), rope.to(device), scales.to(device)


def record_pool(mode: ValueMode | str, *, device: Device) -> Tensor:
    """The mode's P distinct records, uint8 [POOL_RECORDS, 656] (scales not yet per record); the same
    bytes on every device. Shared by every case of the process: read it, never write it."""
    return _pool(ValueMode(mode), device_name(device))[0]


def scale_rows(mode: ValueMode | str, *, device: Device) -> Tensor:
    """The mode's scale rows, int32 f32 patterns [rows, 4] (read it, never write it)."""
    return _pool(ValueMode(mode), device_name(device))[2]


def record_words(block_words: Tensor, *, block_size: int, device: Device) -> Tensor:
    """int32 [blocks * block_size, 2]: the words of each record of the blocks whose words (31-bit,
    one per block) are given: block b's records read one window of the word table at its word."""
    offsets = block_words & (POOL_WORDS - 1)  # a window start in the table's first copy
    return windows(offsets, block_size * WORDS, device=device).view(-1, WORDS)


def fill_records(out: Tensor, mode: ValueMode | str, *, words: Tensor) -> None:
    """Write the records of ``words`` (``record_words``: [n, 2]) into ``out``, a contiguous uint8
    [n, 656] view (of a cache): codes and rope from the pool rows the first word picks (its bits
    21..30 and 0..9), the four scales from the scale row the second picks (for activations, one
    of the 64 rows of the codes' pool row: its writer scales, shifted)."""
    mode = ValueMode(mode)
    pool, ropes, scales = _pool(mode, device_name(out.device))
    sel = words[:, 0] >> 21
    torch.index_select(pool, 0, sel, out=out)
    out[:, _ROPE] = torch.index_select(ropes, 0, words[:, 0] & (POOL_RECORDS - 1))
    if mode is ValueMode.ACTIVATIONS:
        row = sel * ACT_VARIANTS + (words[:, 1] & (ACT_VARIANTS - 1))
    else:
        row = words[:, 1] & (SCALE_ROWS - 1)
    out[:, _SCALES] = torch.index_select(scales, 0, row).view(torch.uint8)


LAZY_BYTES = 64 << 20  # CPU tensors this large are mapped, not allocated and cleared


def zeros(shape: tuple[int, ...], *, dtype: torch.dtype, device: Device) -> Tensor:
    """A zero tensor. A huge cache (SPEC 8: record offsets past 2**31 and 2**32 bytes) must exist
    for a kernel to index it, but a case makes only the blocks it touches; the rest is zero. On the
    CPU a tensor of LAZY_BYTES or more is anonymous mapped memory, whose pages the kernel hands out
    zero-filled as they are first written: a 4 GB cache costs the blocks written. On a GPU it is
    ``torch.zeros`` (a memset, about 1 ms per 4 GB on an H200)."""
    dev = torch.device(device)
    numel = 1
    for s in shape:
        numel *= int(s)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if dev.type != "cpu" or nbytes < LAZY_BYTES:
        return torch.zeros(tuple(shape), dtype=dtype, device=dev)
    buf = mmap.mmap(-1, nbytes)  # the tensor holds the mapping alive
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(tuple(shape))


def paged_cache(
    draws: Draws, mode: ValueMode | str, *, pool_blocks: int, block_size: int, base_block: int = 0, device: Device
) -> Tensor:
    """A paged cache, uint8 [base_block + pool_blocks, block_size, 656]: blocks below base_block all
    zero (allocated, never generated: views.zeros), then pool_blocks blocks of records of ``mode``,
    block b's records from the b-th word of ``draws``."""
    shape = (base_block + pool_blocks, block_size, RECORD_BYTES)
    cache = (
        zeros(shape, dtype=torch.uint8, device=device)
        if base_block
        else torch.empty(shape, dtype=torch.uint8, device=device)
    )  # every byte of a cache without a zero head is written
    fused = fused_room(device)
    if pool_blocks and fused is not None:  # the same records in one launch (generators/fused)
        mode = ValueMode(mode)
        pool, _, scales = _pool(mode, device_name(device))
        draws.span(pool_blocks)  # the torch path's bounds on the words it reads, the same errors
        window_width(block_size * WORDS)
        fused.fill_records(
            cache,
            first=base_block * block_size,
            n=pool_blocks * block_size,
            table=word_pool(device),
            block_offset=draws.offset,
            block_size=block_size,
            pool=pool,
            scales=scales,
            activations=mode is ValueMode.ACTIVATIONS,
            word_mask=POOL_WORDS - 1,
            scale_mask=SCALE_ROWS - 1,
        )
    elif pool_blocks:
        words = record_words(draws.words(pool_blocks, device=device), block_size=block_size, device=device)
        fill_records(cache[base_block:].view(pool_blocks * block_size, RECORD_BYTES), mode, words=words)
    return cache
