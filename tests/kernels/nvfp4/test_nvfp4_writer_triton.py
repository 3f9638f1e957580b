"""Our Triton nvfp4 writer (SPEC 11.3) under the default writer revision rn_bump.mul_recip:
byte for byte the oracle's over drawn cases, and on the inputs where a rounding shortcut shows
(the quotient rules' 42 tie pairs, e4m3 saturation and ties, NaN, inf, signed zeros)."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.oracles.formats import nvfp4_write
from mlafuzz.oracles.formats.minifloat import e4m3_decode
from mlafuzz.oracles.formats.nvfp4_ties import quotient_rule_disagreements
from mlafuzz.tests.support.helpers import draw_spec, materialize, resolve, run_case

pytest.importorskip("triton")
from mlafuzz.tests.support.cuda_cases import cpu_triton


@cpu_triton
def test_our_triton_writer_is_clean_over_24_drawn_cases():
    entry = resolve("nvfp4_writer", "triton")
    modes = set()
    for seed in range(24):
        case = materialize(draw_spec("nvfp4_writer", seed=seed), seed)
        modes.add(case.spec.values.value)
        assert run_case(case=case, entry=entry).findings == (), case.spec
    assert modes == {"normal", "wide", "extreme", "nan"}


def _write(kv_c: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from mlafuzz.kernels.nvfp4.triton_writer import writer_nvfp4_triton

    n = kv_c.shape[0]
    cache = torch.full((n, 1, 352), 0xA5, dtype=torch.uint8)
    slots = torch.arange(n)
    expected = nvfp4_write.write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots)
    writer_nvfp4_triton(kv_c, k_pe, cache, slots, "nvfp4_ds_mla", torch.ones(1))
    return expected, cache


@cpu_triton
def test_our_triton_writer_writes_vllms_codes_on_every_tie_the_quotient_rules_split():
    # Each pair: a tile whose amax makes scale byte sf (6 * e4m3(sf) rounds to sf without a bump
    # where bf16 can hold it), then the tie value; the reciprocal multiply's code is vLLM's.
    pairs = quotient_rule_disagreements()
    rows = []
    for sf, x in pairs:
        row = torch.zeros(512)
        row[0] = 6 * float(e4m3_decode(torch.tensor([sf], dtype=torch.uint8))[0])
        row[1], row[2] = x, -x
        rows.append(row)
    kv_c = torch.stack(rows).bfloat16()
    k_pe = torch.zeros(len(rows), 64, dtype=torch.bfloat16)
    expected, ours = _write(kv_c, k_pe)
    assert torch.equal(ours, expected)


@cpu_triton
def test_our_triton_writer_saturates_and_rounds_rope_and_special_values_as_the_oracle():
    special = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 448.0, 456.0, 464.0, 1e5, -1e5]
    special += [2.0**-10, 2.0**-9, 3 * 2.0**-10, 2.0**-6 * 1.0625, 1.0625, 1.1875, 2.0**-130]
    k_pe = torch.tensor(special + [0.0] * (64 - len(special))).bfloat16().repeat(2, 1)
    kv_c = torch.zeros(2, 512)
    kv_c[0, : len(special)] = torch.tensor(special)
    kv_c[1, :16] = torch.linspace(-7e-3, 7e-3, 16)  # amax near the scale floor: subnormal scales
    expected, ours = _write(kv_c.bfloat16(), k_pe)
    assert torch.equal(ours, expected)


@pytest.mark.gpu
def test_our_triton_writer_writes_the_oracles_records_on_cuda():
    # Compiled, its f32 division is div.full unless asked: div_rn keeps the reciprocal exact there.
    entry = resolve("nvfp4_writer", "triton")
    for seed in range(40):
        case = materialize(draw_spec("nvfp4_writer", seed=seed), seed, "cuda")
        assert run_case(case=case, entry=entry, rerun=True).findings == (), case.spec
