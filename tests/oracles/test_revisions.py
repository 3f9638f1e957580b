"""Writer contract revisions 2026-07 / 2026-09 (SPEC.md sections 2 and 7):
oracles/writer_scale.py and the `revision` keyword of oracles/codec.py."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from mlafuzz.oracles import codec, writer_scale
from mlafuzz.oracles.codec import encode_rows, encode_rows_loop, tile_scales, write_records, write_records_loop
from mlafuzz.oracles.fpbits import FLT_MIN
from mlafuzz.oracles.writer_scale import (
    F32_1E_4,
    NEWEST,
    REVISIONS,
    log2f_may_disagree,
    log2f_may_disagree_mask,
    pow2_ceil,
    pow2_ceil_loop,
)

DTYPES = (torch.bfloat16, torch.float16)
ENCODERS = (encode_rows, encode_rows_loop)


def f32_of_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def scales_of(rec: torch.Tensor) -> list[list[float]]:
    """The four float32 scales of each record, read with struct (independent of torch views)."""
    return [list(struct.unpack("<4f", bytes(r[512:528].tolist()))) for r in rec]


def one_row(tile_values: list[float], dtype: torch.dtype = torch.bfloat16, tile: int = 0) -> torch.Tensor:
    """A [1, 512] row of ones with tile `tile` holding `tile_values` (repeated to 128)."""
    kv = torch.ones(1, 512, dtype=dtype)
    vals = (tile_values * (128 // len(tile_values) + 1))[:128]
    kv[0, 128 * tile : 128 * tile + 128] = torch.tensor(vals, dtype=torch.float32).to(dtype)
    return kv


def encode_both(kv: torch.Tensor, revision: str) -> list[torch.Tensor]:
    pe = torch.zeros(kv.shape[0], 64, dtype=kv.dtype)
    return [enc(kv_c=kv, k_pe=pe, revision=revision) for enc in ENCODERS]


# ------------------------------------------------------------------ the revision keyword


def test_revision_constants_name_both_contracts_and_newest_is_default() -> None:
    assert REVISIONS[:2] == ("2026-07", "2026-09") and NEWEST == REVISIONS[-1]
    assert codec.REVISIONS is REVISIONS and codec.NEWEST == NEWEST
    kv = torch.randn(2, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    pe = torch.zeros(2, 64, dtype=torch.bfloat16)
    for enc in ENCODERS:
        assert torch.equal(enc(kv_c=kv, k_pe=pe), enc(kv_c=kv, k_pe=pe, revision="2026-09"))


def test_unknown_revision_is_a_value_error_naming_the_allowed_ones() -> None:
    kv, pe = torch.ones(1, 512, dtype=torch.bfloat16), torch.zeros(1, 64, dtype=torch.bfloat16)
    cache = torch.zeros(1, 1, 656, dtype=torch.uint8)
    calls = [
        lambda: encode_rows(kv_c=kv, k_pe=pe, revision="2026-08"),
        lambda: encode_rows_loop(kv_c=kv, k_pe=pe, revision="2026-08"),
        lambda: write_records(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=torch.tensor([0]), revision="x"),
        lambda: write_records_loop(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=torch.tensor([0]), revision="x"),
        lambda: tile_scales(kv_c=kv, revision="newest"),
        lambda: writer_scale.prescale_loop(1.0, revision=""),
        lambda: writer_scale.scale_from_prescale(torch.ones(1), revision="2026"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=", ".join(REVISIONS)):
            call()


def test_revision_is_keyword_only() -> None:
    kv, pe = torch.ones(1, 512, dtype=torch.bfloat16), torch.zeros(1, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError):
        encode_rows(kv, pe, "2026-07")  # type: ignore[misc]


def test_f32_floor_is_the_c_literal_1e_4f() -> None:
    assert struct.pack("<f", F32_1E_4) == struct.pack("<f", float(np.float32(1e-4)))
    assert struct.unpack("<I", struct.pack("<f", F32_1E_4))[0] == 0x38D1B717
    assert 2.0**-14 < F32_1E_4 < 1e-4 < 2.0**-13  # so the floor rounds up to 2**-13


# ------------------------------------------------------------------ every 16-bit pattern


def all_patterns(dtype: torch.dtype, permuted: bool) -> torch.Tensor:
    bits = torch.arange(65536, dtype=torch.int32)
    if permuted:  # mixes NaN, inf, subnormals and big values into the same tiles
        bits = bits[torch.randperm(65536, generator=torch.Generator().manual_seed(7))]
    return bits.to(torch.int16).view(dtype).reshape(128, 512)


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loop_and_vectorized_bit_identical_on_every_16bit_pattern(dtype: torch.dtype, revision: str) -> None:
    kv = all_patterns(dtype, permuted=revision == "2026-09")
    a, b = encode_both(kv, revision)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_2026_09_stores_the_power_of_two_at_or_above_amax_over_448_for_every_pattern(dtype: torch.dtype) -> None:
    kv = all_patterns(dtype, permuted=True)
    rec = encode_rows(kv_c=kv, k_pe=torch.zeros(128, 64, dtype=dtype))
    x = kv.float().reshape(128, 4, 128).numpy()
    with np.errstate(invalid="ignore"):
        amax = np.nanmax(np.where(np.isnan(x), 0, np.abs(x)), axis=2).astype(np.float32)
    s = np.maximum(amax / np.float32(448.0), np.float32(1e-4))  # numpy f32 division: an independent path
    for row, srow in zip(scales_of(rec), s.tolist()):
        for got, si in zip(row, srow):
            # The band where log2 could mislead is unreachable from bf16/fp16 (tested below),
            # so float64 log2 is exact enough here.
            want = math.inf if math.isinf(si) else 2.0 ** math.ceil(math.log2(si))
            assert got == want, (got, si)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_log2f_band_is_unreachable_from_bf16_and_fp16_amax(dtype: torch.dtype) -> None:
    """Every finite 16-bit value as a tile's amax gives an s far from the log2f band."""
    kv = all_patterns(dtype, permuted=False)
    pre = tile_scales(kv_c=kv).prescale
    assert not bool(log2f_may_disagree_mask(pre).any())


# ------------------------------------------------------------------ hard tiles, by hand


@pytest.mark.parametrize("revision, floor", [("2026-07", FLT_MIN), ("2026-09", 2.0**-13)])
def test_all_zero_tile_gets_the_floor_scale_and_signed_zero_codes(revision: str, floor: float) -> None:
    kv = one_row([0.0, -0.0])
    for rec in encode_both(kv, revision):
        assert scales_of(rec)[0][0] == floor
        assert rec[0, :128].tolist() == [0x00, 0x80] * 64


@pytest.mark.parametrize("revision, floor", [("2026-07", FLT_MIN), ("2026-09", 2.0**-13)])
def test_all_nan_tile_gets_the_floor_scale_and_nan_codes(revision: str, floor: float) -> None:
    kv = one_row([math.nan, -math.nan], tile=2)
    for rec in encode_both(kv, revision):
        assert scales_of(rec)[0][2] == floor
        assert rec[0, 256:384].tolist() == [0x7F] * 128


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inf_tile_gets_inf_scale_in_both_revisions(revision: str, dtype: torch.dtype) -> None:
    kv = one_row([-math.inf, 3.0, -2.0, math.nan], dtype=dtype, tile=1)
    for rec in encode_both(kv, revision):
        assert scales_of(rec)[0][1] == math.inf
        assert rec[0, 128:132].tolist() == [0x7F, 0x00, 0x80, 0x7F]  # inf/inf NaN; x/inf = +-0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_amax_exactly_448_times_power_of_two_keeps_that_scale(dtype: torch.dtype) -> None:
    for k in range(-13, 8):  # s = 2**k >= 1e-4f: a power of two stays
        kv = one_row([448.0 * 2.0**k, -(2.0**k)], dtype=dtype)
        for rec in encode_both(kv, "2026-09"):
            assert scales_of(rec)[0][0] == 2.0**k
            assert rec[0, :2].tolist() == [0x7E, 0xB8]  # 448 and -1.0 (0xB8 = -(2**0))
    kv = one_row([448.0 * 2.0**-14], dtype=dtype)  # s = 2**-14 < 1e-4f: the floor wins
    for rec in encode_both(kv, "2026-09"):
        assert scales_of(rec)[0][0] == 2.0**-13 and rec[0, 0] == 0x76  # 224 = 1.75 * 2**7


def test_s_just_above_a_power_of_two_doubles_the_scale() -> None:
    # 1.7578125 is the bf16 right above 1.75 = 448 / 256: s = 2**k * (1 + 1/224).
    for k in (-10, -3, 0, 5):
        amax = 1.7578125 * 2.0 ** (k + 8)
        kv = one_row([amax, 1.75 * 2.0 ** (k + 8)])
        for rec in encode_both(kv, "2026-09"):
            assert scales_of(rec)[0][0] == 2.0 ** (k + 1)
            # amax / 2**(k+1) = 225 -> 224 (RNE, step 16), 1.75*2**(k+8) / 2**(k+1) = 224 exactly
            assert rec[0, :2].tolist() == [0x76, 0x76]
        for rec in encode_both(kv, "2026-07"):
            s = scales_of(rec)[0][0]
            assert s == float(np.float32(amax) / np.float32(448.0)) and rec[0, 0] == 0x7E


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_subnormal_tile_codes_by_revision(dtype: torch.dtype) -> None:
    tiny = 2.0**-133 if dtype == torch.bfloat16 else 2.0**-24  # smallest subnormal of each
    kv = one_row([tiny, -tiny, 0.0], dtype=dtype)
    for rec in encode_both(kv, "2026-09"):  # scale 2**-13: tiny / 2**-13 rounds to +-0
        assert scales_of(rec)[0][0] == 2.0**-13
        assert rec[0, :3].tolist() == [0x00, 0x80, 0x00]
    for rec in encode_both(kv, "2026-07"):
        s = scales_of(rec)[0][0]
        if dtype == torch.bfloat16:  # amax / 448 < FLT_MIN: scale FLT_MIN, 2**-133 / 2**-126 = 2**-7 = 4 * 2**-9
            assert s == FLT_MIN and rec[0, :2].tolist() == [0x04, 0x84]
        else:  # 2**-24 / 448 is a normal f32; the code is 448 -> 0x7E
            assert s == float(np.float32(tiny) / np.float32(448.0)) and rec[0, :2].tolist() == [0x7E, 0xFE]


def test_hand_worked_records() -> None:
    """336 / 448 = 0.75 -> scale 1.0 (vLLM PR #49435's own boundary case), 336 is a tie
    between e4m3 320 and 352 -> 320 (even mantissa) = 0x7A; 2026-07 keeps 0.75 and 448."""
    kv = one_row([336.0, -336.0, 1.0])
    for rec in encode_both(kv, "2026-09"):
        assert scales_of(rec)[0] == [1.0, 2.0**-8, 2.0**-8, 2.0**-8]  # ones: 1/448 -> 2**-8
        assert rec[0, :3].tolist() == [0x7A, 0xFA, 0x38]  # 1.0 = 0x38
        assert rec[0, 128] == 0x78  # 1.0 / 2**-8 = 256 = 0x78
    for rec in encode_both(kv, "2026-07"):
        assert scales_of(rec)[0][0] == 0.75 and rec[0, :2].tolist() == [0x7E, 0xFE]
    small = one_row([2.0**-5])  # 2**-5 / 448 < 1e-4f -> 2**-13; 2**-5 / 2**-13 = 256
    for rec in encode_both(small, "2026-09"):
        assert scales_of(rec)[0][0] == 2.0**-13 and rec[0, 0] == 0x78


@pytest.mark.parametrize("revision", REVISIONS)
def test_write_records_store_the_revisions_record(revision: str) -> None:
    gen = torch.Generator().manual_seed(5)
    kv = (torch.randn(3, 512, generator=gen) * 100).to(torch.bfloat16)
    pe = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    cache = torch.zeros(2, 2, 656, dtype=torch.uint8)
    want = encode_rows_loop(kv_c=kv, k_pe=pe, revision=revision)
    for writer in (write_records, write_records_loop):
        out = writer(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=torch.tensor([3, -1, 0]), revision=revision)
        assert torch.equal(out[1, 1], want[0]) and torch.equal(out[0, 0], want[2])
        assert not out[0, 1].any() and not out[1, 0].any()


def test_tile_scales_exposes_amax_prescale_and_stored_scale() -> None:
    kv = one_row([336.0, math.nan, -5.0])
    ts = tile_scales(kv_c=kv)
    assert ts.amax.tolist() == [[336.0, 1.0, 1.0, 1.0]]
    assert ts.prescale[0, 0].item() == 0.75 and ts.scale[0, 0].item() == 1.0
    old = tile_scales(kv_c=kv, revision="2026-07")
    assert torch.equal(old.scale, old.prescale) and old.scale[0, 0].item() == 0.75


# ------------------------------------------------------------------ pow2_ceil and the log2f band


def edge_bits() -> list[int]:
    out = [0, 1, 2, 3, 5, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7F000000, 0x7F000001]
    for e in range(1, 255):
        p = e << 23
        out += [p, p + 1, p + 2, p + 3, p - 1, p + 0x400000, p + 0x7FFFFF]
    for j in range(23):  # subnormal powers of two and neighbours
        out += [1 << j, (1 << j) + 1, (1 << j) - 1]
    return sorted({b for b in out if 0 <= b <= 0x7FFFFFFF})


def test_pow2_ceil_rounds_up_exactly_on_edge_bit_patterns() -> None:
    bits = edge_bits()
    s = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    got = pow2_ceil(s).view(torch.int32).tolist()
    for b, g in zip(bits, got):
        x = f32_of_bits(b)
        want = pow2_ceil_loop(x)
        assert struct.pack("<f", f32_of_bits(g)) == struct.pack("<f", want), hex(b)
        if 0 < x < math.inf:  # smallest power of two >= x, from exact integers
            m, e = math.frexp(x)
            assert want == (x if m == 0.5 else (math.inf if e >= 128 else 2.0**e))
    assert pow2_ceil_loop(f32_of_bits(0x7F000001)) == math.inf  # 2**127 * (1 + ulp) -> 2**128: overflow
    assert pow2_ceil_loop(3 * 2.0**-149) == 2.0**-147  # subnormal


def test_pow2_ceil_vectorized_matches_loop_on_random_bit_patterns() -> None:
    bits = torch.randint(0, 0x7F800001, (20000,), generator=torch.Generator().manual_seed(2))
    s = bits.to(torch.int32).view(torch.float32)
    got = pow2_ceil(s).tolist()
    assert got == [pow2_ceil_loop(x) for x in s.tolist()]


def test_log2f_band_flags_only_a_few_ulps_just_above_powers_of_two() -> None:
    p13 = 0x39000000  # 2**-13
    assert f32_of_bits(p13) == 2.0**-13
    assert not log2f_may_disagree(p13)  # a power of two itself
    assert log2f_may_disagree(p13 + 1) and log2f_may_disagree(p13 + 2)  # log2 = -13 + 1.7e-7: rounds onto -13
    assert not log2f_may_disagree(p13 - 1)  # below: ceil is -13 whichever way log2f rounds
    assert not log2f_may_disagree(p13 + 64)
    assert not log2f_may_disagree(0x3F800001)  # 1 + ulp: log2 = 1.7e-7 is representable, k = 0
    assert not log2f_may_disagree(0x3F000001)  # 0.5 + ulp: 2.9 ulps from -1
    assert log2f_may_disagree(0x40800001) and not log2f_may_disagree(0x40800008)  # 4 + 1 ulp / 8 ulps
    for b in (0, 0x7F800000, 0x7FC00000, 0x80000001, 0xBF800001):
        assert not log2f_may_disagree(b)  # zero, inf, NaN, negatives


def test_log2f_band_mask_matches_the_scalar_classifier() -> None:
    bits = edge_bits() + torch.randint(0, 0x7F800001, (5000,), generator=torch.Generator().manual_seed(3)).tolist()
    s = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    assert log2f_may_disagree_mask(s).tolist() == [log2f_may_disagree(b) for b in bits]


def test_exact_rule_beats_log2f_in_the_band() -> None:
    """s = 2**-13 * (1 + 2**-23): the exact rule gives 2**-12; a float32 log2 of s is within
    1.7e-7 of -13, under half an ulp (4.8e-7) there, so a correctly rounded log2f says -13."""
    s = f32_of_bits(0x39000001)
    assert pow2_ceil_loop(s) == 2.0**-12
    exact_log2 = math.log2(s)
    assert float(np.float32(exact_log2)) == -13.0  # what a correctly rounded log2f returns
