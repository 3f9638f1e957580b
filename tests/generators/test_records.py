"""Tests for mlafuzz.generators.rng.records: cache records of each value mode, and paged caches."""

from __future__ import annotations

import math

import pytest
import torch

from mlafuzz.generators import catalog
from mlafuzz.generators.rng import records
from mlafuzz.generators.rng.bits import BF16, normal_bits, to_half
from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.spec import ValueMode
from mlafuzz.oracles.codec import dequant_records, encode_rows

CPU = "cpu"
D = Draws(2026, "test-records")


def _records(mode: ValueMode | str, blocks: int, bs: int = 16, draws: Draws = D) -> torch.Tensor:
    return records.paged_cache(draws, mode, pool_blocks=blocks, block_size=bs, device=CPU).reshape(-1, 656)


def _scales(rec: torch.Tensor) -> torch.Tensor:
    return rec[:, 512:528].contiguous().view(torch.float32)


def _scale_bits(rec: torch.Tensor) -> set[int]:
    return set((rec[:, 512:528].contiguous().view(torch.int32).reshape(-1).to(torch.int64) & 0xFFFFFFFF).tolist())


@pytest.mark.parametrize("mode", list(ValueMode))
def test_records_are_deterministic_and_a_block_depends_only_on_its_word(mode: ValueMode) -> None:
    full = _records(mode, 20)
    assert full.dtype == torch.uint8 and full.shape == (320, 656)
    assert torch.equal(full, _records(mode, 20))
    assert torch.equal(_records(mode, 7), full[: 7 * 16])  # fewer blocks: a prefix
    assert not torch.equal(full, _records(mode, 20, draws=Draws(1, "other")))
    words = records.record_words(D.words(20, device=CPU)[[3, 3, 11]], block_size=16, device=CPU)
    out = torch.empty((48, 656), dtype=torch.uint8)
    records.fill_records(out, mode, words=words)
    assert torch.equal(out, torch.cat([full[48:64], full[48:64], full[176:192]]))


@pytest.mark.parametrize("mode", list(ValueMode))
def test_pools_are_made_once_on_the_cpu_and_modes_share_no_bytes(mode: ValueMode) -> None:
    pool = records.record_pool(mode, device=CPU)
    assert pool is records.record_pool(mode, device=CPU) and pool.shape == (records.POOL_RECORDS, 656)
    recs = _records(mode, 256)
    assert torch.unique(recs, dim=0).shape[0] == 4096
    rows = records.scale_rows(mode, device=CPU)
    assert rows.dtype == torch.int32 and rows.shape[1] == 4 and torch.unique(rows, dim=0).shape[0] > 1000
    other = ValueMode.SUBNORMAL if mode is ValueMode.EXTREME_SCALES else ValueMode.EXTREME_SCALES
    assert (recs[:64, :512] != _records(other, 4)[:, :512]).float().mean() > 0.9


def test_a_power_of_two_scale_shift_is_the_writer_output_of_the_scaled_input() -> None:
    # The claim the activations mode rests on: encode(x * 2**k) is encode(x) with each scale * 2**k.
    w = Stream(0, "shift").words((64, 512), device=CPU)
    x = to_half(normal_bits(w, BF16), torch.bfloat16)
    k_pe = to_half(normal_bits(w[:, :64], BF16), torch.bfloat16)
    base = encode_rows(kv_c=x, k_pe=k_pe, revision="2026-07")
    for k in (-20, -7, 1, 20):
        shifted = encode_rows(kv_c=x * 2.0**k, k_pe=k_pe, revision="2026-07")  # exact: a power of two
        bits = base[:, 512:528].contiguous().view(torch.int32) + (k << 23)
        assert torch.equal(shifted[:, :512], base[:, :512]) and torch.equal(shifted[:, 528:], base[:, 528:])
        assert torch.equal(shifted[:, 512:528].contiguous().view(torch.int32), bits)


def test_activations_are_pool_writer_outputs_with_shifted_scales() -> None:
    recs = _records("activations", 128)
    assert torch.isfinite(dequant_records(recs).float()).all()
    pool = records.record_pool("activations", device=CPU)
    by_codes = {bytes(r[:512].tolist()): r for r in pool}
    for rec in recs[:64]:
        row = by_codes[bytes(rec[:512].tolist())]  # the codes are a pool row's ...
        got = rec[512:528].view(torch.int32).long()
        want = row[512:528].contiguous().view(torch.int32).long()
        shift = got - want  # ... and each scale is its scale times 2**k, |k| <= 20 (zero tiles keep FLT_MIN)
        assert ((shift % (1 << 23)) == 0).all() and (shift.abs() <= 20 << 23).all()
    scales = _scales(recs)
    nonzero = scales[scales > catalog.FLT_MIN]
    assert math.log2(nonzero.max() / nonzero.min()) > 35  # 2**-20..2**20 per tile
    assert (scales == catalog.FLT_MIN).float().mean() > 0.03  # all-zero tiles (1/16)


def test_all_codes_records_each_hold_every_code() -> None:
    recs = _records("all_codes", 13)
    per_record = torch.sort(recs[:, :512].long(), dim=1).values
    assert (per_record == torch.arange(256).repeat_interleave(2)).all()
    assert torch.isfinite(_scales(recs)).all() and (_scales(recs) > 0).all()
    exps = torch.frexp(_scales(recs)).exponent
    assert int(exps.min()) <= -20 and int(exps.max()) >= 20  # exponents spread over [-24, 24]


@pytest.mark.parametrize(
    "mode,table", [("extreme_scales", catalog.EXTREME_SCALES), ("subnormal", catalog.SUBNORMAL_SCALES)]
)
def test_catalog_scale_modes(mode: str, table: tuple[float, ...]) -> None:
    recs = _records(mode, 32)
    allowed = set(
        torch.tensor(table, dtype=torch.float32).view(torch.int32).to(torch.int64).bitwise_and(0xFFFFFFFF).tolist()
    )
    assert _scale_bits(recs) == allowed  # every catalog value, nothing else
    assert not ((recs[:, :512] & 0x7F) == 0x7F).any()  # no NaN codes


def test_nan_mode_has_nan_codes_nonfinite_scales_and_special_ropes() -> None:
    recs = _records("nan", 64)
    codes = recs[:, :512]
    assert 0.1 < ((codes & 0x7F) == 0x7F).float().mean() < 0.15  # 1/8 + 1/128
    scales = _scales(recs)
    nonfinite = (~torch.isfinite(scales)).float().mean()
    assert torch.isnan(scales).any() and (scales == math.inf).any() and (scales == -math.inf).any()
    assert 0.13 < nonfinite < 0.25  # 3/16
    rope = recs[:, 528:].contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    assert set(catalog.ROPE_SPECIAL_BITS) <= set(rope.reshape(-1).tolist())


def test_a_cache_high_in_a_larger_one_is_zeros_then_the_same_blocks() -> None:
    low = records.paged_cache(D, "nan", pool_blocks=9, block_size=8, device=CPU)
    high = records.paged_cache(D, "nan", pool_blocks=9, block_size=8, base_block=1000, device=CPU)
    assert high.shape == (1009, 8, 656)
    assert not high[:1000].any() and torch.equal(high[1000:], low)


def test_a_huge_cpu_cache_costs_only_the_blocks_written() -> None:
    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    before = resident()
    base = (1 << 32) // (64 * 656) + 1  # every record past 2**32 bytes
    cache = records.paged_cache(D, "all_codes", pool_blocks=4, block_size=64, base_block=base, device=CPU)
    assert cache.numel() > 1 << 32 and cache[base:].any()
    assert resident() - before < 64 << 20  # 4.3 GB of cache, a few MB resident


def test_zeros_maps_large_cpu_tensors_and_allocates_small_ones() -> None:
    small = records.zeros((4, 4), dtype=torch.float32, device=CPU)
    assert small.dtype == torch.float32 and not small.any()
    big = records.zeros((records.LAZY_BYTES // 2,), dtype=torch.int16, device=CPU)
    big[-1] = 7
    assert int(big[-1]) == 7 and not big[:-1].any()
