"""Exact e2m1 ties and the tie-aware record comparison (oracles/formats/nvfp4_ties.py, SPEC 11.3)."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.oracles.formats.minifloat import E2M1_MAGNITUDES, e2m1_rn_satfinite_code, e4m3_value
from mlafuzz.oracles.formats.nvfp4_record import pack, unpack
from mlafuzz.oracles.formats.nvfp4_ties import E2M1_TIES, compare_records, exact_ties, quotient_rule_disagreements
from mlafuzz.oracles.formats.nvfp4_write import encode_rows

SPEC_TILE = [5.5, 4.6875, 2.34375, 1.171875] + [0.0] * 12


def test_the_tie_set_is_the_midpoints_and_each_rounds_to_its_even_neighbour() -> None:
    assert E2M1_TIES == (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
    for k, tie in enumerate(E2M1_TIES):
        lo, hi = E2M1_MAGNITUDES[k], E2M1_MAGNITUDES[k + 1]
        assert tie - lo == hi - tie and e2m1_rn_satfinite_code(tie) == (k if k % 2 == 0 else k + 1)


def test_mul_recip_and_div_split_exactly_42_positive_pairs_all_ties_of_mantissa_0b111_scales() -> None:
    pairs = quotient_rule_disagreements()
    assert len(pairs) == 42  # SPEC 11.3's count; the negative values mirror them (84 signed pairs)
    quotients = {v / e4m3_value(s) for s, v in pairs}
    assert quotients == {1.25, 2.5, 5.0}
    scales = sorted({s for s, _ in pairs})
    # the 14 normal e4m3 bytes of mantissa 0b111 (0x0F .. 0x77); the subnormal 0x07 (7 x 2^-9) is
    # not among them: its f32 reciprocal's error vanishes in the product's rounding
    assert scales == [(e << 3) | 7 for e in range(1, 15)]
    assert (0x37, 4.6875) in pairs and (0x37, 2.34375) in pairs and (0x37, 1.171875) in pairs


def test_exact_ties_finds_the_spec_tiles_three_ties_and_nothing_else() -> None:
    kv = torch.zeros(2, 512, dtype=torch.bfloat16)
    kv[0, :16] = torch.tensor(SPEC_TILE)
    kv[1, :16] = -torch.tensor(SPEC_TILE)
    sf = torch.full((2, 32), 0x01, dtype=torch.uint8)
    sf[:, 0] = 0x37  # 0.9375
    ties = exact_ties(kv, sf)
    assert ties[:, :4].tolist() == [[False, True, True, True]] * 2 and not ties[:, 4:].any()


def records(revision: str, kv: torch.Tensor) -> torch.Tensor:
    return encode_rows(kv_c=kv, k_pe=torch.ones(kv.shape[0], 64, dtype=torch.bfloat16), revision=revision)


def test_mul_recip_records_are_bit_exact_except_ties_against_the_div_oracle() -> None:
    gen = torch.Generator().manual_seed(11)
    kv = (torch.randn(8, 512, generator=gen) * 3).to(torch.bfloat16)
    kv[0, 16:32] = torch.tensor(SPEC_TILE)
    kv[1, 0:16] = -torch.tensor(SPEC_TILE)
    oracle, writer = records("rn_bump.div", kv), records("rn_bump.mul_recip", kv)
    report = compare_records(kv_c=kv, expected=oracle, actual=writer)
    assert report.exact_except_ties and not report.bit_exact
    assert report.tie_hits >= 6 and report.mismatches == 0
    assert [0, 0, 17] in report.tie_at.tolist() and [1, 0, 1] in report.tie_at.tolist()
    assert report.summary().startswith("bit-exact except ties: 0 mismatches, ")
    assert compare_records(kv_c=kv, expected=oracle, actual=oracle).bit_exact


def test_a_wrong_code_a_wrong_scale_and_a_wrong_rope_byte_are_mismatches_counted_once() -> None:
    kv = torch.zeros(1, 512, dtype=torch.bfloat16)
    kv[0, :16] = torch.tensor(SPEC_TILE)
    kv[0, 16:32] = torch.linspace(-3, 3, 16)
    oracle = records("rn_bump.div", kv)
    p = unpack(oracle)
    codes, scales, rope = p.codes.clone(), p.scales.clone(), p.rope.clone()
    codes[0, 0] = 6  # 5.5 / 0.9375 = 5.87 is no tie: 4.0 instead of 6.0 is wrong
    codes[0, 1] = 5  # 4.6875 / 0.9375 = 5.0 is a tie, but 3.0 is no neighbour of it
    codes[0, 3] = 3  # the tie 1.25's other neighbour: a tie hit
    scales[0, 1] += 1  # block 1's scale: one mismatch, its codes are not judged again
    codes[0, 20] ^= 1
    rope[0, 9] ^= 0x80
    report = compare_records(kv_c=kv, expected=oracle, actual=pack(codes=codes, scales=scales, rope=rope))
    assert report.mismatch_at.tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 1], [0, 2, 9]]
    assert report.tie_at.tolist() == [[0, 0, 3]] and not report.exact_except_ties


@pytest.mark.parametrize("sigma", [1.0, 3.0, 100.0])
def test_records_that_differ_between_the_quotient_rules_are_common_in_normal_tokens(sigma: float) -> None:
    # the contract's "a quarter to a third of the records": why a Triton writer needs the tie-aware compare
    gen = torch.Generator().manual_seed(int(sigma))
    kv = (torch.randn(1000, 512, generator=gen) * sigma).to(torch.bfloat16)
    oracle, writer = records("rn_bump.div", kv), records("rn_bump.mul_recip", kv)
    differ = (oracle != writer).any(dim=1).float().mean().item()
    assert 0.2 <= differ <= 0.4
    report = compare_records(kv_c=kv, expected=oracle, actual=writer)
    assert report.exact_except_ties and report.tie_hits >= int(differ * 1000)
