"""--sanitizer's plumbing, on CPU: memcheck reports charged to the right case, dead children replaced."""

from __future__ import annotations

from pathlib import Path

from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.sanitizer import MARKER, SanitizerExecutor, parse_report
from mlafuzz.reports.findings import Kind

PLANTED = Path(__file__).parents[2] / "support" / "planted"

REPORT = f"""{MARKER}0
{MARKER}0 done
{MARKER}1
========= Invalid __global__ write of size 4 bytes
=========     at _convert_kernel+0x1f0
========= Invalid __global__ read of size 4 bytes
{MARKER}1 done
{MARKER}2
========= ERROR SUMMARY: 2 errors
"""


def test_memcheck_errors_are_charged_to_the_case_whose_marker_precedes_them():
    errors = parse_report(REPORT)
    assert set(errors) == {1}
    assert errors[1][0].startswith("Invalid __global__ write of size 4 bytes")
    assert len(errors[1]) == 2


def test_a_child_that_dies_mid_batch_charges_that_case_and_reruns_the_rest(tmp_path):
    # No sanitizer here (tool_cmd=[]): the batch runs in a plain child, which the
    # planted gather aborts on 3-request batches, like a broken CUDA context would.
    config = FuzzConfig(
        ops=("gather",),
        impls={"gather": f"{PLANTED / 'abort_gather.py'}:gather"},
        device="cpu",
        cases=40,
        out_dir=tmp_path,
    )
    summary = fuzz(config, executor=SanitizerExecutor(device="cpu", batch=20, tool_cmd=[]))
    assert summary.cases == 40  # every case got a verdict despite the deaths
    assert set(summary.by_kind) == {Kind.CRASH.value}
    assert 0 < summary.by_kind[Kind.CRASH.value] < 40
