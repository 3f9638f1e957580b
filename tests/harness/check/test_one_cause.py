"""One cause, one bucket: a finding that explains the mismatches of other outputs or elements
takes them in, and mismatches it does not explain stay findings of their own."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.harness.check.compare import Context, Policy, compare
from mlafuzz.harness.drive.fuzz import case_seed
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.torch_impl import gather_torch
from mlafuzz.reports.findings import Kind, Severity
from mlafuzz.tests.support.helpers import draw_spec, materialize, resolve, run_case

CASES = 12  # drawn cases per check (run seed 0)


def _kinds(op: str, impl: str, device: str = "cpu") -> list[set[str]]:
    entry = resolve(op, impl)
    out = []
    for i in range(CASES):
        seed = case_seed(0, op, i)
        result = run_case(case=materialize(draw_spec(op, seed=seed), seed, device), entry=entry)
        out.append({f.kind.value for f in result.findings if f.severity is Severity.ERROR})
    return out


def test_the_comparator_leaves_out_the_elements_it_is_told_to_skip():
    ctx = Context(op="gather", impl="x", case_id="c")
    exp = torch.zeros(2, 3, dtype=torch.bfloat16)
    act = exp.clone()
    act[1] = float("nan")  # the row that was never written
    act[0, 0] = 1.0  # and one wrong element elsewhere
    skip = torch.tensor([False, False, False, True, True, True])
    (f,) = compare(expected={"dst": exp}, actual={"dst": act}, policy=Policy(), ctx=ctx, skip={"dst": skip})
    assert f.kind is Kind.VALUE_MISMATCH and f.count == 1 and f.mismatches[0].index == (0, 0)
    assert "3 never-written elements left to MISSING_WRITE" in f.message
    (g,) = compare(expected={"dst": exp}, actual={"dst": act}, policy=Policy(), ctx=ctx)
    assert g.kind is Kind.VALUE_MISMATCH and g.count == 4  # without the mask: the unwritten row counted as wrong values


def test_a_gather_that_skips_its_last_row_draws_missing_write_alone():
    kinds = _kinds("gather", "gather_skip_last_row")
    assert {"MISSING_WRITE"} in kinds and all(k <= {"MISSING_WRITE"} for k in kinds), kinds


@pytest.mark.gpu
def test_on_the_gpu_a_gather_that_skips_its_last_row_draws_missing_write_alone():
    """The fast path flags the case, the full path judges it on the device: the same one bucket."""
    kinds = _kinds("gather", "gather_skip_last_row", device="cuda")
    assert {"MISSING_WRITE"} in kinds and all(k <= {"MISSING_WRITE"} for k in kinds), kinds


def test_a_wrong_element_beside_an_unwritten_row_stays_a_value_mismatch_of_its_own():
    def skip_last_row_and_flip_one(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
        full = torch.empty_like(dst)
        gather_torch(src_cache, full, block_table, workspace_starts, batch_size, seq_starts)
        full.view(torch.int16)[0, 0] ^= 1  # one ulp off, at an element that is written
        dst[:-1].copy_(full[:-1])

    entry = ImplEntry(
        op="gather",
        name="skip_and_flip",
        loader=lambda device: skip_last_row_and_flip_one,
        devices=frozenset({"cpu"}),
        rejects=frozenset(),
    )
    spec = GatherSpec(requests=(GatherRequest(context_len=8, length=8),))
    result = run_case(case=materialize(spec, 5, "cpu"), entry=entry)
    by_kind = {f.kind: f for f in result.findings}
    assert set(by_kind) == {Kind.MISSING_WRITE, Kind.VALUE_MISMATCH}
    assert by_kind[Kind.MISSING_WRITE].count == 576  # the last row
    assert by_kind[Kind.VALUE_MISMATCH].count == 1 and by_kind[Kind.VALUE_MISMATCH].mismatches[0].index == (0, 0)


def test_a_step_that_gathers_without_seq_starts_is_one_metadata_finding_counting_the_rows_it_spoiled():
    kinds = _kinds("step", "step_no_seq_starts")
    assert {"METADATA_MISMATCH"} in kinds and all(k <= {"METADATA_MISMATCH"} for k in kinds), kinds
    entry = resolve("step", "step_no_seq_starts")
    for i in range(CASES):
        seed = case_seed(0, "step", i)
        found = run_case(case=materialize(draw_spec("step", seed=seed), seed, "cpu"), entry=entry).findings
        if found:
            (f,) = found
            assert f.cause == "step:gather_calls" and "context_rows" in f.message
            assert {g["tensor"] for g in f.extra["folded"]} == {"context_rows"}
            return
    raise AssertionError("no case drew the bug")


def test_a_steps_wrong_split_is_one_bucket_however_many_outputs_follow_from_it():
    entry = resolve("step", "step_second_split")
    causes: set[str] = set()
    for i in range(CASES):
        seed = case_seed(0, "step", i)
        for f in run_case(case=materialize(draw_spec("step", seed=seed), seed, "cpu"), entry=entry).findings:
            if f.kind is Kind.METADATA_MISMATCH and not f.cause.startswith("step:"):
                causes.add(f.cause)
                assert f.extra.get("also_differ"), f.message  # the outputs after it, named in one finding
    assert causes == {"num_decodes:value"}


def test_a_step_whose_plan_is_right_keeps_its_gathers_own_mismatches(monkeypatch):
    monkeypatch.setenv("MLAFUZZ_STEP_GATHER", "gather_truncate_bf16")  # a sub-op bug, not the pipeline's
    kinds = _kinds("step", "ours")
    compared = {"VALUE_MISMATCH", "NAN_MISMATCH", "SUBNORMAL_FLUSH"}  # the comparator's own, never folded away
    assert {"VALUE_MISMATCH"} in kinds and all(k <= compared for k in kinds), kinds
