"""The line a run prints for each new bucket: an info says it does not fail the run."""

from __future__ import annotations

from mlafuzz.reports.console import finding_line
from mlafuzz.reports.findings import Finding, Kind, Severity


def _finding(severity: Severity) -> Finding:
    return Finding(
        kind=Kind.ACCEPTED_INVALID_INPUT,
        op="gather",
        impl="cuda",
        case_id="gather-1-ab",
        tensor=None,
        cause="ws0_nonzero",
        message="ran an input outside its contract (ws0_nonzero: workspace_starts[0] != 0)",
        severity=severity,
    )


def test_an_info_bucket_line_says_it_does_not_fail_the_run_and_an_error_line_does_not_say_so():
    assert finding_line(_finding(Severity.INFO)).startswith("  info, not failing: ACCEPTED_INVALID_INPUT gather=cuda")
    assert finding_line(_finding(Severity.ERROR)).startswith("  ACCEPTED_INVALID_INPUT gather=cuda")
