"""SPEC 9.2 and 9.4 on the GPU (run on the H200: ``pytest -m gpu``): our Triton convert with
caller-owned outputs, which the fast path judges itself (its prefill: harness/fast/convert.py), our Triton DCP
filter and the torch peer-slot map, 0 findings; the new mutants killed on CUDA."""

from __future__ import annotations

import pytest

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS


@pytest.mark.gpu
@pytest.mark.parametrize("op, impl", [("convert", "triton"), ("dcp", "triton"), ("dcp_peer", "torch")])
def test_our_kernels_on_the_new_surfaces_draw_no_findings_on_cuda(tmp_path, op, impl):
    config = FuzzConfig(ops=(op,), impls={op: impl}, device="cuda", cases=300, seed=1, out_dir=tmp_path)
    summary = fuzz(config, executor=InProcess(session=Session(table=OPS)))
    assert summary.cases == 300 and summary.skipped == 0 and summary.findings == 0, summary.by_kind
    if op != "dcp":
        assert summary.coverage["caller-out"] >= 50 and summary.coverage["caller-out:2-steps"] >= 10


@pytest.mark.gpu
@pytest.mark.parametrize(
    "op, mutant, kind",
    [
        ("convert", "convert_out_stale_invalid", "MISSING_WRITE"),
        ("convert", "convert_out_row_minus1", "OOB_WRITE"),
        ("convert", "convert_out_not_returned", "VALUE_MISMATCH"),
        ("convert", "convert_out_stale_compacted", "MISSING_WRITE"),
        ("dcp", "dcp_compact_hole", "VALUE_MISMATCH"),
    ],
)
def test_caller_out_and_dcp_mutants_are_killed_on_cuda_with_their_kind(tmp_path, op, mutant, kind):
    config = FuzzConfig(ops=(op,), impls={op: mutant}, device="cuda", cases=150, seed=1, out_dir=tmp_path)
    summary = fuzz(config, executor=InProcess(session=Session(table=OPS)))
    assert set(summary.by_kind) == {kind}, summary.by_kind
