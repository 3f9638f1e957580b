"""Tests for mlafuzz.oracles.codec / fpbits (SPEC.md section 2)."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.oracles import codec, fpbits
from mlafuzz.oracles.codec import (
    FLT_MIN,
    RECORD_BYTES,
    bf16_rne_bits,
    dequant_records,
    dequant_records_loop,
    encode_rows,
    encode_rows_loop,
    fp8_e4m3fn_to_f32_bits,
    write_records,
    write_records_loop,
)

FAST = settings(max_examples=40, deadline=None)

SCALES = [
    1.0,
    0.5,
    2.0**-126,
    1e-45,
    1e-40,
    3.4e38,
    1e30,
    2.0**-140,
    0.0,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    1 / 448,
    1e-3,
    7.0,
]


def bits16(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16).to(torch.int64) & 0xFFFF


def f32(x: float) -> float:
    """x rounded to float32 by numpy (independent of fpbits)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def random_records(gen: torch.Generator, n: int) -> torch.Tensor:
    rec = torch.randint(0, 256, (n, RECORD_BYTES), dtype=torch.uint8, generator=gen)
    # Random scale bit patterns hit NaN/inf rarely; plant some specials and
    # also realistic scales so most products are ordinary numbers.
    scales = rec[:, 512:528].clone().view(torch.float32)
    pick = torch.randint(0, 4, scales.shape, generator=gen)
    sane = torch.rand(scales.shape, generator=gen) * 2.0**-4
    specials = torch.tensor([math.nan, math.inf, 2.0**-149, FLT_MIN])[torch.randint(0, 4, scales.shape, generator=gen)]
    scales = torch.where(pick == 0, sane, torch.where(pick == 1, specials, scales))
    rec[:, 512:528] = scales.view(torch.uint8)
    rec[:, :8] = torch.tensor([0x7F, 0xFF, 0x00, 0x80, 0x01, 0x81, 0x7E, 0xFE], dtype=torch.uint8)
    return rec


# ------------------------------------------------------------ scalar helpers


def test_fp8_decode_helper_matches_torch_for_all_256_codes() -> None:
    ref = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    for code in range(256):
        got = fp8_e4m3fn_to_f32_bits(code)
        if code in (0x7F, 0xFF):
            assert math.isnan(got) and math.isnan(ref[code])
        else:
            assert got == ref[code] and math.copysign(1, got) == math.copysign(1, ref[code])
    assert fp8_e4m3fn_to_f32_bits(0x7E) == 448.0 and fp8_e4m3fn_to_f32_bits(0x01) == 2.0**-9


@FAST
@given(st.floats(allow_nan=False, width=64))
def test_f32_rne_helper_matches_numpy_float32_rounding(x: float) -> None:
    assert struct.pack("<f", fpbits.f32_rne(x)) == struct.pack("<f", f32(x))


@FAST
@given(st.integers(0, 2**32 - 1))
def test_bf16_rne_bits_matches_torch_cpu_conversion_on_f32_bit_patterns(bits: int) -> None:
    x = struct.unpack("<f", struct.pack("<I", bits))[0]
    if math.isnan(x):
        assert bf16_rne_bits(x) == 0x7FC0
        return
    ref = torch.tensor([x], dtype=torch.float32).to(torch.bfloat16)
    assert bf16_rne_bits(x) == int(bits16(ref))


def test_bf16_rne_ties_subnormals_and_overflow() -> None:
    as_f = lambda b: struct.unpack("<f", struct.pack("<I", b))[0]  # noqa: E731
    assert bf16_rne_bits(as_f(0x3F808000)) == 0x3F80  # tie, even stays
    assert bf16_rne_bits(as_f(0x3F818000)) == 0x3F82  # tie, odd goes up
    assert bf16_rne_bits(as_f(0x00008000)) == 0x0000  # subnormal tie to zero
    assert bf16_rne_bits(as_f(0x00018000)) == 0x0002  # subnormal tie up
    assert bf16_rne_bits(as_f(0x7F7F8000)) == 0x7F80  # tie past max -> inf
    assert bf16_rne_bits(-0.0) == 0x8000


@FAST
@given(st.floats(min_value=-448.0, max_value=448.0, width=32))
def test_e4m3_helper_matches_torch_cpu_cast_in_range(x: float) -> None:
    ref = torch.tensor([x], dtype=torch.float32).to(torch.float8_e4m3fn).view(torch.uint8)
    assert fpbits.e4m3fn_satfinite_code(x) == int(ref)


def test_e4m3_helper_saturates_and_canonicalizes_nan() -> None:
    enc = fpbits.e4m3fn_satfinite_code
    assert enc(449.0) == 0x7E and enc(1e30) == 0x7E and enc(math.inf) == 0x7E
    assert enc(-1e30) == 0xFE and enc(-math.inf) == 0xFE
    assert enc(math.nan) == 0x7F and enc(-math.nan) == 0x7F
    assert enc(-0.0) == 0x80 and enc(-(2.0**-11)) == 0x80
    assert enc(2.0**-10) == 0x00 and enc(3 * 2.0**-10) == 0x02  # ties to even


# ------------------------------------------------------------ dequant


def test_dequant_exhaustive_codes_times_scales_matches_bit_level_reference() -> None:
    scales32 = [f32(s) for s in SCALES]
    # Two tiles per scale (256 codes), two scales per record.
    recs = torch.zeros(len(scales32) // 2, RECORD_BYTES, dtype=torch.uint8)
    codes = torch.arange(256, dtype=torch.uint8)
    for k, s in enumerate(scales32):
        r, half = divmod(k, 2)
        recs[r, half * 256 : half * 256 + 256] = codes
        for t in (2 * half, 2 * half + 1):
            recs[r, 512 + 4 * t : 516 + 4 * t] = torch.tensor(list(struct.pack("<f", s)), dtype=torch.uint8)
    for out in (dequant_records(recs), dequant_records_loop(recs)):
        got = bits16(out[:, :512]).reshape(-1).tolist()
        for k, s in enumerate(scales32):
            for code in range(256):
                g = got[k * 256 + code]
                v = fp8_e4m3fn_to_f32_bits(code)
                with np.errstate(invalid="ignore"):
                    p = f32(v * s)  # exact double product, numpy f32 rounding
                if math.isnan(p):
                    assert (g & 0x7FFF) > 0x7F80, (code, s)
                else:
                    assert g == bf16_rne_bits(p), (hex(code), s, hex(g))


@FAST
@given(st.integers(0, 2**31), st.integers(1, 4))
def test_dequant_loop_and_vectorized_agree_on_random_records(seed: int, n: int) -> None:
    rec = random_records(torch.Generator().manual_seed(seed), n)
    assert torch.equal(bits16(dequant_records(rec)), bits16(dequant_records_loop(rec)))


def test_dequant_int32_rounding_is_the_int64_bit_trick_on_every_class_of_f32_pattern() -> None:
    edges = [0, 1, 0x7FFF, 0x8000, 0x8001, 0x00017FFF, 0x00018000, 0x007FFFFF, 0x00800000, 0x3F808000]
    edges += [0x3F818000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF]
    patterns = edges + [b | 0x80000000 for b in edges]
    rand = torch.randint(0, 2**32, (1 << 16,), generator=torch.Generator().manual_seed(5), dtype=torch.int64)
    bits = torch.cat([torch.tensor(patterns, dtype=torch.int64), rand])
    x = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    got = codec._f32_to_bf16(x).view(torch.int16).to(torch.int64) & 0xFFFF
    assert torch.equal(got, codec._f32_to_bf16_bits(x))
    assert got[: len(edges)].tolist()[-4:] == [0x7F80, 0x7FC0, 0x7FC0, 0x7FC0]  # inf, then NaNs canonical


def test_dequant_accepts_float8_view_and_leading_dims() -> None:
    rec = random_records(torch.Generator().manual_seed(1), 6).reshape(2, 3, RECORD_BYTES)
    ref = dequant_records(rec)
    assert ref.shape == (2, 3, 576) and ref.dtype == torch.bfloat16
    assert torch.equal(bits16(dequant_records(rec.view(torch.float8_e4m3fn))), bits16(ref))
    assert torch.equal(bits16(dequant_records_loop(rec.view(torch.float8_e4m3fn))), bits16(ref))
    assert dequant_records(rec[:0, 0]).shape == (0, 576)


def test_dequant_rope_is_bit_copy_including_nan_payloads() -> None:
    rec = torch.zeros(1, RECORD_BYTES, dtype=torch.uint8)
    pats = [0x7FC1, 0xFF81, 0x7F80, 0x0001, 0x8000, 0x1234] + [0xFFFF] * 58
    rec[0, 528:] = torch.tensor(pats, dtype=torch.int32).to(torch.int16).view(torch.uint8)
    for out in (dequant_records(rec), dequant_records_loop(rec)):
        assert bits16(out[0, 512:]).tolist() == pats


def test_dequant_keeps_subnormal_products() -> None:
    rec = torch.zeros(1, RECORD_BYTES, dtype=torch.uint8)
    rec[0, 0] = 0x01  # 2**-9
    rec[0, 512:516] = torch.tensor(list(struct.pack("<f", 2.0**-124)), dtype=torch.uint8)
    for out in (dequant_records(rec), dequant_records_loop(rec)):
        assert int(bits16(out[0, :1])) == 0x0001  # 2**-133, smallest bf16 subnormal


# ------------------------------------------------------------ writer


def special_rows(gen: torch.Generator, n: int, dtype: torch.dtype) -> torch.Tensor:
    raw = torch.randint(0, 2**16, (n, 512), generator=gen, dtype=torch.int32)
    vals = raw.to(torch.int16).view(dtype).float()
    normal = torch.randn(n, 512, generator=gen) * torch.exp2(
        torch.randint(-30, 30, (n, 4, 1), generator=gen).float()
    ).repeat_interleave(128, 1).reshape(n, 512)
    mode = torch.randint(0, 3, (n, 4, 1), generator=gen).expand(n, 4, 128).reshape(n, 512)
    x = torch.where(mode == 0, vals, normal).to(dtype)
    return x


@FAST
@given(st.integers(0, 2**31), st.integers(1, 3), st.sampled_from([torch.bfloat16, torch.float16]))
def test_encode_loop_and_vectorized_bit_identical(seed: int, n: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    kv = special_rows(gen, n, dtype)
    pe = torch.randint(0, 2**16, (n, 64), generator=gen, dtype=torch.int32).to(torch.int16).view(dtype)
    assert torch.equal(encode_rows(kv_c=kv, k_pe=pe), encode_rows_loop(kv_c=kv, k_pe=pe))


@FAST
@given(st.integers(0, 2**31), st.integers(-40, 40))
def test_writer_roundtrip_is_within_fp8_precision(seed: int, exp: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    kv = (torch.randn(2, 512, generator=gen) * 2.0**exp).to(torch.bfloat16)
    pe = torch.randn(2, 64, generator=gen).to(torch.bfloat16)
    rec = encode_rows(kv_c=kv, k_pe=pe)
    back = dequant_records(rec)
    x = kv.float().reshape(2, 4, 128)
    scale = rec[:, 512:528].contiguous().view(torch.float32).reshape(2, 4, 1)
    err = (back[:, :512].float().reshape(2, 4, 128) - x).abs()
    # e4m3: 3 mantissa bits (rel 2**-4), subnormal step 2**-9 * scale (half of
    # it as rounding error); then bf16 output rounding (rel 2**-9).
    bound = x.abs() * (2.0**-4 + 2.0**-8) + scale * 2.0**-9
    assert bool((err <= bound).all())
    assert torch.equal(bits16(back[:, 512:]), bits16(pe))


def test_writer_codes_saturate_at_448() -> None:
    # 2026-07 only: a power-of-two scale (2026-09) is never below amax / 448.
    # Find a bf16 amax whose f32(amax / 448) rounds down, so amax / scale > 448.
    amax = next(
        a for a in (1.0 + k / 128 for k in range(128)) if Fraction(a) / Fraction(fpbits.f32_div(a, 448.0)) > 448
    )
    kv = torch.zeros(1, 512, dtype=torch.bfloat16)
    kv[0, 0], kv[0, 1], kv[0, 130] = amax, -amax, 3.0
    pe = torch.zeros(1, 64, dtype=torch.bfloat16)
    for rec in (
        encode_rows(kv_c=kv, k_pe=pe, revision="2026-07"),
        encode_rows_loop(kv_c=kv, k_pe=pe, revision="2026-07"),
    ):
        assert rec[0, 0] == 0x7E and rec[0, 1] == 0xFE and rec[0, 130] == 0x7E
        assert int(rec[0, :512].max()) <= 0xFE and 0x7F not in rec[0, :512].tolist()


def test_writer_all_nan_tile_gives_flt_min_scale_and_nan_codes() -> None:
    kv = torch.ones(1, 512, dtype=torch.bfloat16)
    kv[0, :128] = torch.tensor(math.nan)
    kv[0, :64] = -kv[0, :64]
    pe = torch.zeros(1, 64, dtype=torch.bfloat16)
    for rec in (
        encode_rows(kv_c=kv, k_pe=pe, revision="2026-07"),
        encode_rows_loop(kv_c=kv, k_pe=pe, revision="2026-07"),
    ):
        assert rec[0, :128].tolist() == [0x7F] * 128
        assert struct.unpack("<f", bytes(rec[0, 512:516].tolist()))[0] == FLT_MIN


def test_writer_zero_tile_gives_flt_min_scale_and_signed_zero_codes() -> None:
    kv = torch.ones(1, 512, dtype=torch.bfloat16)
    kv[0, 128:256] = 0.0
    kv[0, 200] = -0.0
    pe = torch.zeros(1, 64, dtype=torch.bfloat16)
    for rec in (
        encode_rows(kv_c=kv, k_pe=pe, revision="2026-07"),
        encode_rows_loop(kv_c=kv, k_pe=pe, revision="2026-07"),
    ):
        assert struct.unpack("<f", bytes(rec[0, 516:520].tolist()))[0] == FLT_MIN
        assert rec[0, 128:256].tolist() == [0x80 if i == 72 else 0 for i in range(128)]


def test_writer_inf_tile_follows_ieee() -> None:
    kv = torch.ones(1, 512, dtype=torch.bfloat16)
    kv[0, 5], kv[0, 6] = math.inf, -2.0
    pe = torch.zeros(1, 64, dtype=torch.bfloat16)
    for rec in (encode_rows(kv_c=kv, k_pe=pe), encode_rows_loop(kv_c=kv, k_pe=pe)):
        assert struct.unpack("<f", bytes(rec[0, 512:516].tolist()))[0] == math.inf
        assert rec[0, 5] == 0x7F and rec[0, 6] == 0x80 and rec[0, 0] == 0x00


def test_writer_fp16_rope_copies_raw_bits() -> None:
    kv = torch.ones(1, 512, dtype=torch.float16)
    pe = torch.tensor([[1.0, -2.5, 65504.0, 6e-8] * 16], dtype=torch.float16)
    for rec in (encode_rows(kv_c=kv, k_pe=pe), encode_rows_loop(kv_c=kv, k_pe=pe)):
        assert torch.equal(rec[0, 528:].view(torch.int16), pe[0].view(torch.int16))


def make_cache(gen: torch.Generator, num_blocks: int, bs: int) -> torch.Tensor:
    return torch.randint(0, 256, (num_blocks, bs, RECORD_BYTES), dtype=torch.uint8, generator=gen)


def test_writer_negative_slot_writes_nothing_and_nothing_else_changes() -> None:
    gen = torch.Generator().manual_seed(3)
    cache = make_cache(gen, 3, 3)
    kv = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    pe = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([4, -1, 8])
    for writer in (write_records, write_records_loop):
        out = writer(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=slots)
        assert out.data_ptr() != cache.data_ptr()
        flat_in, flat_out = cache.reshape(9, RECORD_BYTES), out.reshape(9, RECORD_BYTES)
        untouched = [s for s in range(9) if s not in (4, 8)]
        assert torch.equal(flat_out[untouched], flat_in[untouched])
        assert torch.equal(flat_out[4], encode_rows(kv_c=kv[:1], k_pe=pe[:1])[0])
        assert torch.equal(flat_out[8], encode_rows(kv_c=kv[2:], k_pe=pe[2:])[0])


@FAST
@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
def test_writer_loop_and_vectorized_bit_identical(seed: int, n: int, bs: int, blocks: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    cache = make_cache(gen, blocks, bs)
    kv = special_rows(gen, n + 1, torch.bfloat16)  # one padding row past T
    pe = torch.randn(n + 1, 64, generator=gen).to(torch.bfloat16)
    slots = torch.randint(-2, blocks * bs, (n,), generator=gen)  # duplicates and negatives
    a = write_records(kv_c=kv, k_pe=pe, kv_cache=cache.view(torch.float8_e4m3fn), slot_mapping=slots)
    b = write_records_loop(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=slots)
    assert a.dtype == torch.uint8 and torch.equal(a, b)


def test_writer_duplicate_slot_last_token_wins() -> None:
    cache = torch.zeros(1, 2, RECORD_BYTES, dtype=torch.uint8)
    kv = torch.stack([torch.full((512,), 1.0), torch.full((512,), 2.0)]).to(torch.bfloat16)
    pe = torch.zeros(2, 64, dtype=torch.bfloat16)
    for writer in (write_records, write_records_loop):
        out = writer(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=torch.tensor([1, 1]))
        assert torch.equal(out[0, 1], encode_rows(kv_c=kv[1:], k_pe=pe[1:])[0])


def test_writer_slot_past_cache_raises() -> None:
    cache = torch.zeros(1, 2, RECORD_BYTES, dtype=torch.uint8)
    kv, pe = torch.zeros(1, 512, dtype=torch.bfloat16), torch.zeros(1, 64, dtype=torch.bfloat16)
    for writer in (write_records, write_records_loop):
        with pytest.raises(ValueError, match="past the cache"):
            writer(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=torch.tensor([2]))


def test_codec_constants() -> None:
    assert (codec.RECORD_BYTES, codec.NOPE_DIM, codec.ROPE_DIM, codec.TILE, codec.ROW_DIM, codec.FP8_MAX) == (
        656,
        512,
        64,
        128,
        576,
        448.0,
    )
