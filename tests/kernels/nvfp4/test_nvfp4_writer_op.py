"""The nvfp4_writer op (SPEC 11.3): our torch writer writes the oracle's records under every writer
revision, SPEC's test tile under each quotient rule, is clean over drawn cases, and each planted
writer bug is killed with its kind on the CPU."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.kernels.nvfp4.torch_writer import encode_records
from mlafuzz.oracles.formats import nvfp4_write, writer_rules
from mlafuzz.tests.support.helpers import cpu_mutants, draw_spec, materialize, resolve, run_case


def _drawn(n: int):
    for seed in range(n):
        yield materialize(draw_spec("nvfp4_writer", seed=seed), seed)


@pytest.mark.parametrize("revision", writer_rules.names())
def test_our_torch_writer_writes_the_oracles_records_under_each_revision(revision):
    modes = set()
    for case in _drawn(24):
        t = case.tensors
        modes.add(case.spec.values.value)
        ours = encode_records(t["kv_c"], t["k_pe"], revision=revision)
        assert torch.equal(ours, nvfp4_write.encode_rows(kv_c=t["kv_c"], k_pe=t["k_pe"], revision=revision))
    assert modes == {"normal", "wide", "extreme", "nan"}


@pytest.mark.parametrize(("revision", "codes"), [("rn_bump.mul_recip", [7, 7, 5, 3]), ("rn_bump.div", [7, 6, 4, 2])])
def test_specs_test_tile_writes_its_codes_under_each_quotient_rule(revision, codes):
    tile = torch.zeros(1, 512, dtype=torch.bfloat16)
    tile[0, :4] = torch.tensor([5.5, 4.6875, 2.34375, 1.171875])
    rec = encode_records(tile, torch.zeros(1, 64, dtype=torch.bfloat16), revision=revision)
    assert [int(rec[0, 0]) & 15, int(rec[0, 0]) >> 4, int(rec[0, 1]) & 15, int(rec[0, 1]) >> 4] == codes


def test_our_torch_writer_is_clean_over_40_drawn_cases():
    entry = resolve("nvfp4_writer", "torch")
    for case in _drawn(40):
        assert run_case(case=case, entry=entry).findings == (), case.spec


def test_each_nvfp4_writer_mutant_is_killed_with_its_kind_on_the_cpu(tmp_path):
    results, clean = cpu_mutants("nvfp4_writer", cases=40, out=tmp_path)
    bugs = ("no_bump", "div", "rope_unsaturated", "bump_added", "mul_recip", "identity_scales", "swapped_nibbles")
    assert {r.name for r in results} == {f"nvfp4_writer_{b}" for b in (*bugs, "fp8_stride")}
    assert clean == [] and all(r.killed and r.found == ("VALUE_MISMATCH",) for r in results), results


@pytest.mark.gpu
def test_our_torch_writer_writes_the_oracles_records_on_cuda():
    entry = resolve("nvfp4_writer", "torch")
    for seed in range(40):
        case = materialize(draw_spec("nvfp4_writer", seed=seed), seed, "cuda")
        assert run_case(case=case, entry=entry, rerun=True).findings == (), case.spec
