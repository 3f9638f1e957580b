"""fp8_ds_mla cache records of each value mode (SPEC.md section 2), shared by every op's materializer."""

from __future__ import annotations

from typing import Callable

import torch

from mlafuzz.generators import catalog
from mlafuzz.generators.spec import ValueMode
from mlafuzz.oracles.codec import encode_rows

RECORD_BYTES = 656


def randint(gen: torch.Generator, lo: int, hi: int, size: tuple[int, ...] = ()) -> torch.Tensor:
    """Uniform ints in [lo, hi) (hi > lo)."""
    return torch.randint(lo, hi, size, generator=gen, dtype=torch.int64)


def _records_from_parts(codes: torch.Tensor, scales: torch.Tensor, rope_bits: torch.Tensor) -> torch.Tensor:
    n = codes.shape[0]
    return torch.cat([
        codes.to(torch.uint8),
        scales.to(torch.float32).contiguous().view(torch.uint8).reshape(n, 16),
        rope_bits.to(torch.int16).contiguous().view(torch.uint8).reshape(n, 128),
    ], dim=1)


def _finite_rope_bits(gen: torch.Generator, n: int) -> torch.Tensor:
    return torch.randn((n, 64), generator=gen).to(torch.bfloat16).view(torch.int16)


def _table_lookup(values: tuple[float, ...], gen: torch.Generator, size: tuple[int, ...]) -> torch.Tensor:
    table = torch.tensor(values, dtype=torch.float32)
    return table[randint(gen, 0, len(values), size)]


def _activations(gen: torch.Generator, n: int) -> torch.Tensor:
    """Writer output for activations with magnitudes spread over 2^-20..2^20 per tile."""
    mag = torch.exp2(randint(gen, -20, 21, (n, 4, 1)).float())
    kv_c = (torch.randn((n, 4, 128), generator=gen) * mag).reshape(n, 512)
    zero_tiles = randint(gen, 0, 16, (n, 4, 1)) == 0  # an all-zero tile gives scale FLT_MIN
    kv_c = kv_c.reshape(n, 4, 128).masked_fill(zero_tiles, 0.0).reshape(n, 512)
    k_pe = torch.randn((n, 64), generator=gen)
    # Records as the 2026-07 writer makes them: unrounded scales, so the gather's f32 multiply rounds
    # (a power-of-two scale never would, and would hide a wrong rounding).
    return encode_rows(kv_c=kv_c.to(torch.bfloat16), k_pe=k_pe.to(torch.bfloat16), revision="2026-07")


def _all_codes(gen: torch.Generator, n: int) -> torch.Tensor:
    # Every code appears: a fresh permutation of 0..255 for each run of 256 elements
    # (argsort of random keys: one vectorized call however large the cache).
    groups = -(-(n * 512) // 256)
    perms = torch.rand((groups, 256), generator=gen).argsort(dim=1)
    codes = perms.reshape(-1)[:n * 512].reshape(n, 512)
    scales = torch.exp2(torch.randn((n, 4), generator=gen) * 8)
    return _records_from_parts(codes, scales, _finite_rope_bits(gen, n))


def _extreme_scales(gen: torch.Generator, n: int) -> torch.Tensor:
    codes = randint(gen, 0, 256, (n, 512))
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)  # no NaN codes here
    return _records_from_parts(codes, _table_lookup(catalog.EXTREME_SCALES, gen, (n, 4)), _finite_rope_bits(gen, n))


def _subnormal(gen: torch.Generator, n: int) -> torch.Tensor:
    codes = randint(gen, 0, 256, (n, 512))
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    return _records_from_parts(codes, _table_lookup(catalog.SUBNORMAL_SCALES, gen, (n, 4)), _finite_rope_bits(gen, n))


def _nan(gen: torch.Generator, n: int) -> torch.Tensor:
    codes = randint(gen, 0, 256, (n, 512))
    nan_at = randint(gen, 0, 8, (n, 512)) == 0
    codes = torch.where(nan_at, torch.tensor(catalog.NAN_FP8_CODES)[randint(gen, 0, 2, (n, 512))], codes)
    scales = torch.exp2(torch.randn((n, 4), generator=gen) * 4)
    bad = randint(gen, 0, 6, (n, 4)) == 0
    scales = torch.where(bad, _table_lookup(catalog.NONFINITE_SCALES, gen, (n, 4)), scales)
    rope = _finite_rope_bits(gen, n)
    special = torch.tensor(catalog.ROPE_SPECIAL_BITS, dtype=torch.int32).to(torch.int16)
    rope_at = randint(gen, 0, 6, (n, 64)) == 0
    rope = torch.where(rope_at, special[randint(gen, 0, len(special), (n, 64))], rope)
    return _records_from_parts(codes, scales, rope)


RECORD_MAKERS: dict[ValueMode, Callable[[torch.Generator, int], torch.Tensor]] = {
    ValueMode.ACTIVATIONS: _activations,
    ValueMode.ALL_CODES: _all_codes,
    ValueMode.EXTREME_SCALES: _extreme_scales,
    ValueMode.SUBNORMAL: _subnormal,
    ValueMode.NAN: _nan,
}


def make_records(*, mode: ValueMode, n: int, gen: torch.Generator) -> torch.Tensor:
    """n fp8_ds_mla records, uint8 [n, 656], of the given value mode."""
    return RECORD_MAKERS[mode](gen, n)


def make_cache(*, mode: ValueMode, num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    return make_records(mode=mode, n=num_blocks * block_size, gen=gen).reshape(num_blocks, block_size, RECORD_BYTES)
