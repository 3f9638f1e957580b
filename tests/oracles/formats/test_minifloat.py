"""e2m1 and e4m3 codecs (oracles/formats/minifloat.py): decoding, and round to nearest even with
saturation, held exhaustively to independent definitions."""

from __future__ import annotations

import math

import pytest
import torch

from mlafuzz.oracles.formats.minifloat import (
    E2M1_MAGNITUDES,
    e2m1_decode,
    e2m1_rn_satfinite,
    e2m1_rn_satfinite_code,
    e2m1_value,
    e4m3_decode,
    e4m3_rn_satfinite,
    e4m3_rn_satfinite_code,
    e4m3_value,
)


def every_bf16() -> torch.Tensor:
    """All 65,536 bf16 bit patterns as f32 values (NaNs, infinities, subnormals, -0 included)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()


def near(points: torch.Tensor) -> torch.Tensor:
    """Each f32 point, its neighbours one ulp either side, and their negatives."""
    up = torch.nextafter(points, torch.full_like(points, math.inf))
    down = torch.nextafter(points, torch.full_like(points, -math.inf))
    x = torch.cat([points, up, down])
    return torch.cat([x, -x])


def test_e2m1_decodes_spec_11_1s_table_with_code_8_as_minus_zero() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    values = e2m1_decode(codes)
    assert values.tolist() == [e2m1_value(c) for c in range(16)]
    assert values[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6] and values[9:].tolist() == [
        -0.5,
        -1,
        -1.5,
        -2,
        -3,
        -4,
        -6,
    ]
    assert values[8].item() == 0 and math.copysign(1, values[8].item()) < 0 and math.copysign(1, e2m1_value(8)) < 0


def test_e4m3_decode_matches_the_bit_level_definition_on_all_256_bytes() -> None:
    values = e4m3_decode(torch.arange(256, dtype=torch.int32).to(torch.uint8)).tolist()
    for code, v in enumerate(values):
        ref = e4m3_value(code)
        assert (math.isnan(v) and math.isnan(ref)) or (v == ref and math.copysign(1, v) == math.copysign(1, ref))
    assert [c for c, v in enumerate(values) if math.isnan(v)] == [0x7F, 0xFF]
    assert values[0x7E] == 448 and values[0x01] == 2.0**-9


def brute_e2m1(x: float) -> int:
    """Independent of the module: the nearest of the 16 code values by float distance (exact for
    these small values), ties to the even code, and the sign of x."""
    if math.isnan(x):
        return 0
    best = min(range(8), key=lambda c: (abs(min(abs(x), 6.0) - E2M1_MAGNITUDES[c]), c & 1))
    return best | (8 if math.copysign(1, x) < 0 else 0)


def test_e2m1_rounding_is_nearest_even_saturating_on_every_bf16_and_around_every_midpoint() -> None:
    mids = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:])] + [6.0, 7.0])
    x = torch.cat([every_bf16(), near(mids)])
    got = e2m1_rn_satfinite(x).tolist()
    xs = x.tolist()
    assert got == [e2m1_rn_satfinite_code(v) for v in xs]
    assert got == [brute_e2m1(v) for v in xs]


@pytest.mark.parametrize(
    "x, code",
    [
        (0.25, 0),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (5.5, 7),
        (1e9, 7),
        (math.inf, 7),
        (-0.25, 8),
        (-5.0, 14),
        (-math.inf, 15),
        (-0.1, 8),
    ],
)
def test_e2m1_ties_go_to_the_even_code_and_large_values_saturate_at_6(x: float, code: int) -> None:
    assert e2m1_rn_satfinite_code(x) == code == int(e2m1_rn_satfinite(torch.tensor([x]))[0])


def test_e4m3_rounding_matches_the_exact_reference_on_every_bf16_and_around_every_midpoint() -> None:
    mags = e4m3_decode(torch.arange(0x7F, dtype=torch.uint8))
    x = torch.cat([every_bf16(), near((mags[:-1] + mags[1:]) / 2), near(mags), near(torch.tensor([464.0, 480.0]))])
    got = e4m3_rn_satfinite(x).tolist()
    assert got == [e4m3_rn_satfinite_code(v) for v in x.tolist()]


def test_e4m3_rounding_matches_torchs_float8_cast_for_finite_values_in_range() -> None:
    gen = torch.Generator().manual_seed(7)
    bits = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), every_bf16()])
    x = x[torch.isfinite(x) & (x.abs() <= 448)]
    assert torch.equal(e4m3_rn_satfinite(x), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3_saturates_at_448_and_maps_nan_to_0x7f() -> None:
    x = torch.tensor([448.0, 463.9, 464.0, 480.0, 1e30, math.inf, -464.0, -math.inf, math.nan, -math.nan])
    assert e4m3_rn_satfinite(x).tolist() == [0x7E] * 6 + [0xFE, 0xFE, 0x7F, 0x7F]
