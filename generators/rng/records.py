"""fp8_ds_mla cache records (SPEC section 2), one builder per ValueMode, made on the device.

Speed: hashing every byte of a 100+ MB cache is too slow on a GPU, so each
mode first makes a POOL of P = 1024 distinct records exactly (element by
element from the stream), and record s of the cache is then

    codes of pool[sel(s)], rope of pool[rope(s)], four scales of its own:

two row gathers and a 16-byte write per record, about one pass over the
cache's bytes. sel, rope and the scales come from the words at (s * W + j) of
the sub-stream "slot", so a record depends only on (stream, slot):
``records_at`` for any subset of slots, in any grouping, gives the rows of
the full cache.

What each record owns beyond its two pool rows (the rope of an activations
record is still a writer output: the writer copies k_pe whatever kv_c is):

- activations: a power-of-two shift 2**k, k in [-20, 20], of each non-zero
  tile's scale. The pool rows are the writer oracle's output for normal-like
  bf16 inputs, so a shifted record is exactly what the writer makes of the
  input scaled by 2**k (amax and scale scale exactly, the codes are the same).
  The magnitude spread per tile is the old generator's 2**-20..2**20.
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
differs with probability 1 - 1/1024), and a real bug makes many wrong reads.
Not guaranteed: that a given pair differs (it is chance, not construction),
and in the subnormal mode that the *dequantized* nope parts differ, since
many products round to zero there (the ropes still differ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from mlafuzz.generators import catalog
from mlafuzz.generators.rng.bits import BF16, Device, const, f32_pattern, normal_bits, pick, to_half
from mlafuzz.generators.rng.hashing import Stream, as_int32, scale_below
from mlafuzz.generators.spec import ValueMode
from mlafuzz.oracles.codec import encode_rows

__all__ = ["POOL_RECORDS", "RECORD_BYTES", "make_pool", "records", "records_at", "cache", "cache_blocks",
           "activations", "all_codes", "extreme_scales", "subnormal", "nan"]

RECORD_BYTES = 656
POOL_RECORDS = 1024
_SCALES = slice(512, 528)
_ROPE = slice(528, 656)
_FLT_MIN_BITS = 0x0080_0000
_BYTE_SHIFTS = (0, 8, 16, 24)

_EXTREME_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.EXTREME_SCALES)
_SUBNORMAL_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.SUBNORMAL_SCALES)
_NONFINITE_SCALE_BITS = tuple(f32_pattern(v) for v in catalog.NONFINITE_SCALES)


def _dev(device: Device) -> str:
    return str(torch.device(device))


def _byte_fields(word: Tensor) -> Tensor:
    """[n] words -> [n, 4] bytes (one random byte per tile)."""
    return (word.unsqueeze(-1) >> const(_BYTE_SHIFTS, _dev(word.device))) & 0xFF


def _rope_bytes(bits: Tensor) -> Tensor:
    return to_half(bits, torch.bfloat16).view(torch.uint8).reshape(bits.shape[0], 128)


def _from_parts(codes: Tensor, rope_bits: Tensor) -> Tensor:
    """Pool records from codes (uint8 [P, 512]) and rope patterns; scales are per record."""
    zeros = torch.zeros((codes.shape[0], 16), dtype=torch.uint8, device=codes.device)
    return torch.cat([codes, zeros, _rope_bytes(rope_bits)], dim=1)


def _finite_rope(stream: Stream, device: Device) -> Tensor:
    return normal_bits(stream.child("rope").words((POOL_RECORDS, 64), device=device), BF16)


def _random_codes(stream: Stream, device: Device) -> Tensor:
    """Uniform codes with the two NaN codes moved to their neighbours 0x7E / 0xFE."""
    codes = stream.child("codes").bytes(POOL_RECORDS * 512, device=device).reshape(POOL_RECORDS, 512)
    return torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)


# --- pools -----------------------------------------------------------------

def _activations_pool(stream: Stream, device: Device) -> Tensor:
    w = stream.child("kv_c").words((POOL_RECORDS, 4, 128), device=device)
    bits = normal_bits(w, BF16)
    zero_tile = stream.child("zero_tile").coin(1, 16, (POOL_RECORDS, 4, 1), device=device)  # -> scale FLT_MIN
    bits = bits.masked_fill(zero_tile, 0).reshape(POOL_RECORDS, 512)
    k_pe = to_half(_finite_rope(stream, device), torch.bfloat16)
    # 2026-07 records: unrounded scales, so a gather's f32 multiply rounds (a power of two never would).
    return encode_rows(kv_c=to_half(bits, torch.bfloat16), k_pe=k_pe, revision="2026-07")


def _all_codes_pool(stream: Stream, device: Device) -> Tensor:
    perms = stream.child("codes").permutation(256, batch=(POOL_RECORDS, 2), device=device)
    return _from_parts(perms.reshape(POOL_RECORDS, 512).to(torch.uint8), _finite_rope(stream, device))


def _plain_pool(stream: Stream, device: Device) -> Tensor:
    return _from_parts(_random_codes(stream, device), _finite_rope(stream, device))


def _nan_pool(stream: Stream, device: Device) -> Tensor:
    w = stream.child("codes").words((POOL_RECORDS, 512), device=device)
    nan_code = 0x7F | (((w >> 11) & 1) << 7)  # 0x7F or 0xFF
    codes = torch.where(((w >> 8) & 7) == 0, nan_code, w & 0xFF).to(torch.uint8)
    rw = stream.child("rope").words((POOL_RECORDS, 64), device=device)
    specials = const(catalog.ROPE_SPECIAL_BITS, _dev(device))
    special = specials[pick((rw >> 10) & 63, 6, len(catalog.ROPE_SPECIAL_BITS))]
    rope = torch.where(pick((rw >> 24) & 0x7F, 7, 6) == 0, special, normal_bits(rw, BF16))
    return _from_parts(codes, rope)


# --- per-record scales (int64 f32 patterns [n, 4]) ---------------------------

def _activations_scales(base: Tensor | None, w: Tensor) -> Tensor:
    assert base is not None, "activations records shift the pool's own scales"
    shift = pick(_byte_fields(w[:, 0]), 8, 41) - 20
    return torch.where(base == _FLT_MIN_BITS, base, base + shift * (1 << 23))


def _random_scales(w: Tensor, *, exp_lo: int, exp_hi: int) -> Tensor:
    """Positive normal f32 patterns: exponent uniform in [exp_lo, exp_hi], bits 23..27 pick it."""
    exp = pick((w >> 23) & 31, 5, exp_hi - exp_lo + 1) + exp_lo
    return ((exp + 127) << 23) | (w & 0x7F_FFFF)


def _all_codes_scales(base: Tensor | None, w: Tensor) -> Tensor:
    # 9 bits of exponent choice would fit; 5 bits spread [-24, 24] in steps of ~1.5 binades: enough.
    return _random_scales(w, exp_lo=-24, exp_hi=24)


def _catalog_scales(table: tuple[int, ...]) -> Callable[[Tensor | None, Tensor], Tensor]:
    def scales(base: Tensor | None, w: Tensor) -> Tensor:
        bits = const(table, _dev(w.device))[pick(_byte_fields(w[:, 0]), 8, len(table))]
        return bits & 0xFFFF_FFFF  # signed int32 patterns -> [0, 2**32)
    return scales


def _nan_scales(base: Tensor | None, w: Tensor) -> Tensor:
    finite = _random_scales(w, exp_lo=-12, exp_hi=12)
    which = w >> 28  # 4 bits: 0, 1, 2 -> NaN, +inf, -inf (probability 3/16)
    table = const(_NONFINITE_SCALE_BITS + (0,), _dev(w.device))
    special = table[torch.clamp(which, max=3)] & 0xFFFF_FFFF
    return torch.where(which < 3, special, finite)


@dataclass(frozen=True)
class _Mode:
    pool: Callable[[Stream, Device], Tensor]
    words: int  # words per record: the pool pick, then the scales' words
    scales: Callable[[Tensor | None, Tensor], Tensor]


_MODES: dict[ValueMode, _Mode] = {
    ValueMode.ACTIVATIONS: _Mode(_activations_pool, 2, _activations_scales),
    ValueMode.ALL_CODES: _Mode(_all_codes_pool, 5, _all_codes_scales),
    ValueMode.EXTREME_SCALES: _Mode(_plain_pool, 2, _catalog_scales(_EXTREME_SCALE_BITS)),
    ValueMode.SUBNORMAL: _Mode(_plain_pool, 2, _catalog_scales(_SUBNORMAL_SCALE_BITS)),
    ValueMode.NAN: _Mode(_nan_pool, 5, _nan_scales),
}


# --- public ------------------------------------------------------------------

def make_pool(stream: Stream, mode: ValueMode | str, *, device: Device) -> Tensor:
    """The mode's P distinct records, uint8 [POOL_RECORDS, 656] (scales not yet per record)."""
    mode = ValueMode(mode)
    return _MODES[mode].pool(stream.child(f"pool/{mode.value}"), device)  # modes share no bytes


def _assemble(mode: ValueMode, pool: Tensor, w: Tensor) -> Tensor:
    spec = _MODES[mode]
    # index_select, not pool[sel]: the same gather, twice as fast on the CPU.
    sel = scale_below(w[:, 0], POOL_RECORDS)  # the word's top 10 bits pick the codes row ...
    out = torch.index_select(pool, 0, sel)
    ropes = pool[:, _ROPE].contiguous()  # ... its low 10 bits the rope row
    out[:, _ROPE] = torch.index_select(ropes, 0, w[:, 0] & (POOL_RECORDS - 1))
    base = None
    if mode is ValueMode.ACTIVATIONS:  # the writer's scales, shifted per record
        base = pool[:, _SCALES].contiguous().view(torch.int32).to(torch.int64)[sel]
    out[:, _SCALES] = as_int32(spec.scales(base, w[:, 1:])).contiguous().view(torch.uint8)
    return out


def records_at(stream: Stream, mode: ValueMode | str, *, slots: Tensor, device: Device,
               pool: Tensor | None = None) -> Tensor:
    """The records of the given cache slots (int64 >= 0, any order, repeats allowed): uint8 [n, 656].

    ``pool`` (from ``make_pool``, same mode and device) saves rebuilding it across calls. By
    default it is built from ``stream``; a caller may build it from another stream (say one per
    256 seeds, cached) and pass it to every call: records are then a pure function of (stream,
    slot, pool), replayable as long as the pool's stream is recorded too.
    """
    mode = ValueMode(mode)
    spec = _MODES[mode]
    slots = slots.to(device=device, dtype=torch.int64).reshape(-1, 1)
    index = slots * spec.words + torch.arange(spec.words, dtype=torch.int64, device=device)
    w = stream.child("slot").words_at(index)
    return _assemble(mode, make_pool(stream, mode, device=device) if pool is None else pool, w)


def records(stream: Stream, mode: ValueMode | str, *, n: int, device: Device, pool: Tensor | None = None) -> Tensor:
    """Records of slots 0..n-1: the same bytes as ``records_at(slots=arange(n))``, on the fast word path."""
    mode = ValueMode(mode)
    w = stream.child("slot").words((n, _MODES[mode].words), device=device)
    return _assemble(mode, make_pool(stream, mode, device=device) if pool is None else pool, w)


def cache(stream: Stream, mode: ValueMode | str, *, num_blocks: int, block_size: int, device: Device) -> Tensor:
    """A whole cache, uint8 [num_blocks, block_size, 656]."""
    return records(stream, mode, n=num_blocks * block_size, device=device).reshape(num_blocks, block_size,
                                                                                  RECORD_BYTES)


def cache_blocks(stream: Stream, mode: ValueMode | str, *, block_ids: Tensor, block_size: int, device: Device,
                 pool: Tensor | None = None) -> Tensor:
    """Only the given blocks of a (possibly huge) cache: uint8 [len(block_ids), block_size, 656],
    each block the same bytes it has in ``cache``."""
    ids = block_ids.to(device=device, dtype=torch.int64).reshape(-1, 1)
    slots = ids * block_size + torch.arange(block_size, dtype=torch.int64, device=device)
    out = records_at(stream, mode, slots=slots, device=device, pool=pool)
    return out.reshape(ids.shape[0], block_size, RECORD_BYTES)


def _mode_fn(mode: ValueMode) -> Callable[..., Tensor]:
    def build(stream: Stream, *, slots: Tensor, device: Device, pool: Tensor | None = None) -> Tensor:
        return records_at(stream, mode, slots=slots, device=device, pool=pool)
    build.__name__ = mode.value
    build.__doc__ = f"Records of mode {mode.value!r} for the given slots (see the module docstring)."
    return build


activations = _mode_fn(ValueMode.ACTIVATIONS)
all_codes = _mode_fn(ValueMode.ALL_CODES)
extreme_scales = _mode_fn(ValueMode.EXTREME_SCALES)
subnormal = _mode_fn(ValueMode.SUBNORMAL)
nan = _mode_fn(ValueMode.NAN)
