"""fp8_ds_mla cache records (SPEC section 2), one builder per ValueMode, made on the device.

Speed: hashing every byte of a 100+ MB cache is too slow on a GPU, so each
mode has a POOL of P = 1024 distinct records, made exactly (element by
element from the hash stream ``mlafuzz/records/<mode>``) once per process on
the CPU and copied to each device it is used on: the same bytes in every
process and on every device. Record s of a cache is then

    codes of pool[sel(s)], rope of pool[rope(s)], four scales of its own:

two row gathers and a 16-byte write per record, about one pass over the
cache's bytes, written straight into the cache tensor. sel, rope and the
scales come from W 31-bit words per record: the words of block b are one
window of the word table (pool.py) at the offset its block word gives, so a
record depends only on (the case's stream, its block, its entry).

What each record owns beyond its two pool rows (the rope of an activations
record is still a writer output: the writer copies k_pe whatever kv_c is):

- activations: a power-of-two shift 2**k, k in [-20, 20], of each non-zero
  tile's scale. The pool rows are the writer oracle's output for normal-like
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
row and the same rope row (1/1024 each) and the same four scales: at most
1/(1024**2 * 6**4) < 1e-9 for a given pair (subnormal mode), far less in the
others. A kernel that reads the wrong record, block or tile therefore sees a
different row with probability > 1 - 1e-9 per wrong read (the rope alone
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
from mlafuzz.generators.rng.hashing import Stream, as_int32
from mlafuzz.generators.rng.pool import POOL_WORDS, Draws, windows
from mlafuzz.generators.spec import ValueMode
from mlafuzz.oracles.codec import encode_rows

__all__ = ["POOL_RECORDS", "RECORD_BYTES", "WORDS", "LAZY_BYTES", "record_pool", "fill_records", "record_words",
           "paged_cache", "zeros"]

RECORD_BYTES = 656
POOL_RECORDS = 1024
_SCALES = slice(512, 528)
_ROPE = slice(528, 656)
_FLT_MIN_BITS = 0x0080_0000
_FIELD_SHIFTS = (0, 7, 14, 21)  # four 7-bit fields of a 31-bit word, one per tile

_EXTREME_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.EXTREME_SCALES)
_SUBNORMAL_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.SUBNORMAL_SCALES)
_NONFINITE_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.NONFINITE_SCALES)


def _dev(device: Device) -> str:
    return str(torch.device(device))


def _tile_fields(word: Tensor) -> Tensor:
    """[n] 31-bit words -> [n, 4] 7-bit fields (one per tile), int64."""
    return (word.to(torch.int64).unsqueeze(-1) >> const(_FIELD_SHIFTS, _dev(word.device))) & 0x7F


def _rope_bytes(bits: Tensor) -> Tensor:
    return to_half(bits, torch.bfloat16).view(torch.uint8).reshape(bits.shape[0], 128)


def _from_parts(codes: Tensor, rope_bits: Tensor) -> Tensor:
    """Pool records from codes (uint8 [P, 512]) and rope patterns; scales are per record."""
    zeros = torch.zeros((codes.shape[0], 16), dtype=torch.uint8, device=codes.device)
    return torch.cat([codes, zeros, _rope_bytes(rope_bits)], dim=1)


def _finite_rope(stream: Stream) -> Tensor:
    return normal_bits(stream.child("rope").words((POOL_RECORDS, 64), device="cpu"), BF16)


def _random_codes(stream: Stream) -> Tensor:
    """Uniform codes with the two NaN codes moved to their neighbours 0x7E / 0xFE."""
    codes = stream.child("codes").bytes(POOL_RECORDS * 512, device="cpu").reshape(POOL_RECORDS, 512)
    return torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)


# --- pools (on the CPU: the exact reference bytes, copied to each device) ----------

def _activations_pool(stream: Stream) -> Tensor:
    w = stream.child("kv_c").words((POOL_RECORDS, 4, 128), device="cpu")
    bits = normal_bits(w, BF16)
    zero_tile = stream.child("zero_tile").coin(1, 16, (POOL_RECORDS, 4, 1), device="cpu")  # -> scale FLT_MIN
    bits = bits.masked_fill(zero_tile, 0).reshape(POOL_RECORDS, 512)
    k_pe = to_half(_finite_rope(stream), torch.bfloat16)
    # 2026-07 records: unrounded scales, so a gather's f32 multiply rounds (a power of two never would).
    return encode_rows(kv_c=to_half(bits, torch.bfloat16), k_pe=k_pe, revision="2026-07")


def _all_codes_pool(stream: Stream) -> Tensor:
    perms = stream.child("codes").permutation(256, batch=(POOL_RECORDS, 2), device="cpu")
    return _from_parts(perms.reshape(POOL_RECORDS, 512).to(torch.uint8), _finite_rope(stream))


def _plain_pool(stream: Stream) -> Tensor:
    return _from_parts(_random_codes(stream), _finite_rope(stream))


def _nan_pool(stream: Stream) -> Tensor:
    w = stream.child("codes").words((POOL_RECORDS, 512), device="cpu")
    nan_code = 0x7F | (((w >> 11) & 1) << 7)  # 0x7F or 0xFF
    codes = torch.where(((w >> 8) & 7) == 0, nan_code, w & 0xFF).to(torch.uint8)
    rw = stream.child("rope").words((POOL_RECORDS, 64), device="cpu")
    specials = const(catalog.ROPE_SPECIAL_BITS, "cpu")
    special = specials[pick((rw >> 10) & 63, 6, len(catalog.ROPE_SPECIAL_BITS))]
    rope = torch.where(pick((rw >> 24) & 0x7F, 7, 6) == 0, special, normal_bits(rw, BF16))
    return _from_parts(codes, rope)


# --- per-record scales (int64 f32 patterns [n, 4]) from 31-bit words ------------

def _activations_scales(base: Tensor | None, w: Tensor) -> Tensor:
    assert base is not None, "activations records shift the pool's own scales"
    shift = pick(_tile_fields(w[:, 0]), 7, 41) - 20
    return torch.where(base == _FLT_MIN_BITS, base, base + shift * (1 << 23))


def _random_scales(w: Tensor, *, exp_lo: int, exp_hi: int, exp_bits: int) -> Tensor:
    """Positive normal f32 patterns: a random 23-bit mantissa; the exponent uniform in [exp_lo,
    exp_hi], picked by the ``exp_bits`` bits from bit 23 up."""
    w = w.to(torch.int64)
    exp = pick((w >> 23) & ((1 << exp_bits) - 1), exp_bits, exp_hi - exp_lo + 1) + exp_lo
    return ((exp + 127) << 23) | (w & 0x7F_FFFF)


def _all_codes_scales(base: Tensor | None, w: Tensor) -> Tensor:
    # 5 bits spread [-24, 24] in steps of ~1.5 binades: enough.
    return _random_scales(w, exp_lo=-24, exp_hi=24, exp_bits=5)


def _catalog_scales(table: tuple[int, ...]) -> Callable[[Tensor | None, Tensor], Tensor]:
    def scales(base: Tensor | None, w: Tensor) -> Tensor:
        bits = const(table, _dev(w.device))[pick(_tile_fields(w[:, 0]), 7, len(table))]
        return bits & 0xFFFF_FFFF  # signed int32 patterns -> [0, 2**32)
    return scales


def _nan_scales(base: Tensor | None, w: Tensor) -> Tensor:
    finite = _random_scales(w, exp_lo=-12, exp_hi=12, exp_bits=4)
    which = (w.to(torch.int64) >> 27) & 15  # bits 27..30: 0, 1, 2 -> NaN, +inf, -inf (probability 3/16)
    table = const(_NONFINITE_SCALE_BITS + (0,), _dev(w.device))
    special = table[torch.clamp(which, max=3)] & 0xFFFF_FFFF
    return torch.where(which < 3, special, finite)


@dataclass(frozen=True)
class _Mode:
    pool: Callable[[Stream], Tensor]
    words: int  # words per record: the pool pick, then the scales' words
    scales: Callable[[Tensor | None, Tensor], Tensor]


_MODES: dict[ValueMode, _Mode] = {
    ValueMode.ACTIVATIONS: _Mode(_activations_pool, 2, _activations_scales),
    ValueMode.ALL_CODES: _Mode(_all_codes_pool, 5, _all_codes_scales),
    ValueMode.EXTREME_SCALES: _Mode(_plain_pool, 2, _catalog_scales(_EXTREME_SCALE_BITS)),
    ValueMode.SUBNORMAL: _Mode(_plain_pool, 2, _catalog_scales(_SUBNORMAL_SCALE_BITS)),
    ValueMode.NAN: _Mode(_nan_pool, 5, _nan_scales),
}
WORDS: dict[ValueMode, int] = {m: spec.words for m, spec in _MODES.items()}


@functools.lru_cache(maxsize=32)
def _pool(mode: ValueMode, device: str) -> tuple[Tensor, Tensor, Tensor]:
    cpu = _MODES[mode].pool(Stream(0, f"mlafuzz/records/{mode.value}"))
    rope = cpu[:, _ROPE].contiguous()
    scales = cpu[:, _SCALES].contiguous().view(torch.int32)
    return cpu.to(device), rope.to(device), scales.to(device)


def record_pool(mode: ValueMode | str, *, device: Device) -> Tensor:
    """The mode's P distinct records, uint8 [POOL_RECORDS, 656] (scales not yet per record); the same
    bytes on every device. Shared by every case of the process: read it, never write it."""
    return _pool(ValueMode(mode), _dev(device))[0]


def record_words(block_words: Tensor, mode: ValueMode | str, *, block_size: int, device: Device) -> Tensor:
    """int32 [blocks * block_size, W]: the W words of each record of the blocks whose words (31-bit,
    one per block) are given: block b's records read one window of the word table at its word."""
    w = WORDS[ValueMode(mode)]
    offsets = block_words & (POOL_WORDS - 1)  # a window start in the table's first copy
    return windows(offsets, block_size * w, device=device).view(-1, w)



def fill_records(out: Tensor, mode: ValueMode | str, *, words: Tensor) -> None:
    """Write the records of ``words`` (``record_words``: [n, W]) into ``out``, a contiguous uint8
    [n, 656] view (of a cache): codes and rope from the pool rows the first word picks (its bits
    21..30 and 0..9), scales from the rest."""
    mode = ValueMode(mode)
    spec = _MODES[mode]
    pool, ropes, pool_scales = _pool(mode, _dev(out.device))
    sel = words[:, 0] >> 21
    torch.index_select(pool, 0, sel, out=out)
    out[:, _ROPE] = torch.index_select(ropes, 0, words[:, 0] & (POOL_RECORDS - 1))
    base = None
    if mode is ValueMode.ACTIVATIONS:  # the writer's scales, shifted per record (positive: < 2**31)
        base = torch.index_select(pool_scales, 0, sel).to(torch.int64)
    out[:, _SCALES] = as_int32(spec.scales(base, words[:, 1:])).view(torch.uint8)


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


def paged_cache(draws: Draws, mode: ValueMode | str, *, pool_blocks: int, block_size: int, base_block: int = 0,
                device: Device) -> Tensor:
    """A paged cache, uint8 [base_block + pool_blocks, block_size, 656]: blocks below base_block all
    zero (allocated, never generated: views.zeros), then pool_blocks blocks of records of ``mode``,
    block b's records from the b-th word of ``draws``."""
    shape = (base_block + pool_blocks, block_size, RECORD_BYTES)
    cache = zeros(shape, dtype=torch.uint8, device=device) if base_block else torch.empty(
        shape, dtype=torch.uint8, device=device)  # every byte of a cache without a zero head is written
    tail = cache[base_block:].view(pool_blocks * block_size, RECORD_BYTES)
    if pool_blocks:
        words = record_words(draws.words(pool_blocks, device=device), mode, block_size=block_size, device=device)
        fill_records(tail, mode, words=words)
    return cache
