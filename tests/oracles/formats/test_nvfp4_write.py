"""The nvfp4_ds_mla writer under its four revisions (oracles/formats/nvfp4_write.py, SPEC 11.3)."""

from __future__ import annotations

import math

import pytest
import torch

from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.minifloat import e4m3_value
from mlafuzz.oracles.formats.nvfp4_read import dequant
from mlafuzz.oracles.formats.nvfp4_record import unpack
from mlafuzz.oracles.formats.nvfp4_write import (
    encode_rows,
    encode_rows_loop,
    tile_scale_loop,
    tile_scales,
    write_records,
    write_records_loop,
)

REVISIONS = writer_rules.names()
SPEC_TILE = [5.5, 4.6875, 2.34375, 1.171875] + [0.0] * 12


def tokens(n: int, seed: int, *, low: int = -12, high: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 kv_c [n, 512] whose tiles span many scales (magnitudes 2^low .. 2^high), and k_pe
    [n, 64] up to a few hundred."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(low, high + 1, (n, 32, 1), generator=gen).float())
    kv = (torch.randn(n, 32, 16, generator=gen) * mag).reshape(n, 512).to(torch.bfloat16)
    pe = (torch.randn(n, 64, generator=gen) * 200).to(torch.bfloat16)
    return kv, pe


def one_tile(values: list[float], tile: int = 0) -> torch.Tensor:
    kv = torch.zeros(1, 512, dtype=torch.bfloat16)
    kv[0, 16 * tile : 16 * tile + len(values)] = torch.tensor(values)
    return kv


@pytest.mark.parametrize("revision", REVISIONS)
def test_spec_test_tile_gives_7775_with_mul_recip_and_7642_with_div(revision: str) -> None:
    kv, pe = one_tile(SPEC_TILE, tile=5), torch.zeros(1, 64, dtype=torch.bfloat16)
    want = {"mul_recip": [7, 7, 5, 3], "div": [7, 6, 4, 2]}[writer_rules.get(revision).rule("quotient")]
    for enc in (encode_rows, encode_rows_loop):
        p = unpack(enc(kv_c=kv, k_pe=pe, revision=revision))
        assert p.codes[0, 80:84].tolist() == want and p.codes[0, 84:96].tolist() == [0] * 12
        assert e4m3_value(int(p.scales[0, 5])) == 0.9375  # amax 5.5 / 6 = 0.9167 -> e4m3 15/16


@pytest.mark.parametrize("revision", REVISIONS)
def test_loop_and_vectorized_writers_agree_bit_for_bit(revision: str) -> None:
    kv, pe = tokens(6, 1)
    specials = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-30, 3e38, 2.0**-133])
    kv[0, 32:39] = specials.to(torch.bfloat16)  # one tile with every special value
    kv[1, :16] = float("nan")  # an all-NaN tile
    kv[2, :16] = torch.tensor(SPEC_TILE)  # ties
    pe[0, :6] = torch.tensor([448.0, 464.0, 480.0, -1e5, math.nan, math.inf]).to(torch.bfloat16)
    assert torch.equal(
        encode_rows(kv_c=kv, k_pe=pe, revision=revision), encode_rows_loop(kv_c=kv, k_pe=pe, revision=revision)
    )


def test_scale_rounding_bumps_a_rounded_down_scale_and_rn_does_not() -> None:
    # amax 5.2 (bf16 5.1875): 5.1875 / 6 = 0.8646 -> nearest e4m3 0.875 (>= target: no bump either way)
    # amax 5.0 (target 0.8333): nearest e4m3 0.8125 < target -> rn_bump takes 0.875, rn keeps 0.8125
    assert tile_scale_loop([5.0], scale_rounding="rn") == 0x35 and e4m3_value(0x35) == 0.8125
    assert tile_scale_loop([5.0], scale_rounding="rn_bump") == 0x36 and e4m3_value(0x36) == 0.875
    assert tile_scale_loop([5.1875], scale_rounding="rn") == tile_scale_loop([5.1875], scale_rounding="rn_bump") == 0x36
    # the floor 2^-9 and the ceiling 448 (no bump past 0x7E), NaN left out of amax
    assert tile_scale_loop([0.0, math.nan], scale_rounding="rn_bump") == 0x01
    assert tile_scale_loop([1e6], scale_rounding="rn_bump") == tile_scale_loop([math.inf], scale_rounding="rn") == 0x7E
    kv = one_tile([5.0]).repeat(2, 1)
    assert (
        tile_scales(kv_c=kv, revision="rn.div")[0, 0] == 0x35
        and tile_scales(kv_c=kv, revision="rn_bump.div")[0, 0] == 0x36
    )


@pytest.mark.parametrize("revision", REVISIONS)
def test_read_of_write_is_within_the_e2m1_grid_of_each_tile(revision: str) -> None:
    kv, pe = tokens(16, 2)
    rec = encode_rows(kv_c=kv, k_pe=pe, revision=revision)
    x = kv.float().reshape(16, 32, 16)
    got = dequant(rec)[:, :512].float().reshape(16, 32, 16)
    sf = unpack(rec).scales.contiguous().view(torch.float8_e4m3fn).float().unsqueeze(-1)
    # half the widest e2m1 gap (4 -> 6) is one scale; past 6 * sf only saturation adds to it
    bound = sf * (1 + 2.0**-20) + (x.abs() - 6 * sf).clamp(min=0)
    assert ((got - x).abs() <= bound).all()
    if writer_rules.get(revision).rule("scale_rounding") == "rn_bump":
        assert (x.abs() <= 6 * sf).all()  # the bump's promise: nothing saturates
    # RoPE: the e4m3 nearest each value, 448 at most
    rope = dequant(rec)[:, 512:].float()
    near = pe.float().clamp(-448, 448)  # e4m3's relative step is 1/8, half of it 1/16
    assert (rope.abs() <= 448).all() and ((rope - near).abs() <= near.abs() / 16 + 2.0**-10).all()


@pytest.mark.parametrize("revision", REVISIONS)
def test_rewriting_what_was_read_reproduces_the_bytes(revision: str) -> None:
    # tiles with normal-range scales: every tile's largest code is +-6, so re-reading gives amax =
    # 6 * sf and the same scale; the e2m1 values then quotient back to themselves
    kv, pe = tokens(12, 3, low=-1, high=12)
    rec = encode_rows(kv_c=kv, k_pe=pe, revision=revision)
    largest = unpack(rec).codes.reshape(12, 32, 16) & 7
    assert (largest.amax(dim=-1) == 7).all()
    read = dequant(rec)
    again = encode_rows(kv_c=read[:, :512].contiguous(), k_pe=read[:, 512:].contiguous(), revision=revision)
    assert torch.equal(again, rec)


@pytest.mark.parametrize("revision", REVISIONS)
def test_near_the_scale_floor_only_tiles_whose_largest_code_is_below_6_rewrite_differently(revision: str) -> None:
    # Tiny tiles get subnormal scales (bytes 0x01..0x07, steps of 2^-9), where a scale one step up
    # can leave the largest quotient at 5 or below; re-reading then shows a smaller amax and the
    # re-write picks a smaller scale. Every other tile repeats its bytes.
    kv, pe = tokens(40, 5, low=-16, high=-3)
    rec = encode_rows(kv_c=kv, k_pe=pe, revision=revision)
    read = dequant(rec)
    again = encode_rows(kv_c=read[:, :512].contiguous(), k_pe=read[:, 512:].contiguous(), revision=revision)
    a, b = unpack(rec), unpack(again)
    codes_a, codes_b = a.codes.reshape(40, 32, 16), b.codes.reshape(40, 32, 16)
    changed = (codes_a != codes_b).any(dim=-1) | (a.scales != b.scales)
    top_is_6 = (codes_a & 7).amax(dim=-1) == 7
    assert changed.any() and not (changed & top_is_6).any()
    assert (a.scales[changed] <= 0x07).all() and (b.scales[changed] < a.scales[changed]).all()
    assert torch.equal(a.rope, b.rope)


def test_writer_skips_negative_slots_and_a_later_token_wins_a_repeated_slot() -> None:
    kv, pe = tokens(5, 4)
    cache = torch.full((3, 2, 352), 0xAB, dtype=torch.uint8)
    slots = torch.tensor([4, -1, 0, 4, -7], dtype=torch.int64)
    for write in (write_records, write_records_loop):
        out = write(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=slots)
        rec = encode_rows(kv_c=kv, k_pe=pe)
        assert torch.equal(out[0, 0], rec[2]) and torch.equal(out[2, 0], rec[3])
        untouched = [(0, 1), (1, 0), (1, 1), (2, 1)]
        assert all((out[b, e] == 0xAB).all() for b, e in untouched)
        assert (cache == 0xAB).all()  # the input cache is not changed
    with pytest.raises(ValueError, match="slots past the cache"):
        write_records(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=torch.tensor([6, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="expected one of rn_bump.mul_recip"):
        encode_rows(kv_c=kv, k_pe=pe, revision="2026-09")


def test_no_tokens_write_no_records_and_leave_the_cache_as_it_was() -> None:
    kv, pe = torch.zeros(0, 512, dtype=torch.bfloat16), torch.zeros(0, 64, dtype=torch.bfloat16)
    for enc in (encode_rows, encode_rows_loop):
        assert enc(kv_c=kv, k_pe=pe).shape == (0, 352)
    cache = torch.full((2, 2, 352), 7, dtype=torch.uint8)
    for write in (write_records, write_records_loop):
        assert torch.equal(
            write(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=torch.zeros(0, dtype=torch.int64)), cache
        )


def test_rope_saturates_at_448_where_old_torch_casts_gave_nan() -> None:
    values = [448.0, 464.0, 480.0, 1e5, math.inf, -500.0, -math.inf, math.nan, 432.0, 2.0**-10]
    pe = torch.zeros(1, 64, dtype=torch.bfloat16)
    pe[0, : len(values)] = torch.tensor(values).to(torch.bfloat16)
    kv = torch.zeros(1, 512, dtype=torch.bfloat16)
    for enc in (encode_rows, encode_rows_loop):
        rope = unpack(enc(kv_c=kv, k_pe=pe)).rope[0, : len(values)].tolist()
        # 432 is the tie between 416 (0x7D) and 448 (0x7E): even wins; 2^-10 ties 0 and 2^-9: 0
        assert rope == [0x7E] * 5 + [0xFE, 0xFE, 0x7F, 0x7E, 0x00]
