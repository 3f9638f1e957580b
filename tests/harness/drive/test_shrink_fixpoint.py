"""The shrinker reaches a fixpoint: it keeps reducing until no smaller proposal shows the finding
(under the case's seed or the few others it derives) or the budget ends, and only then says
"complete". A block table read at the wrong row (vLLM #55184's logical width for the row stride)
shows only where that row holds another block id; the case's own values once left one shrink at
3 requests with most of its budget unspent."""

from __future__ import annotations

import dataclasses

import pytest

from mlafuzz.harness.drive.fuzz import FuzzConfig
from mlafuzz.harness.drive.shrink import shrink
from mlafuzz.harness.drive.tasks import execute
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.findings import Severity
from mlafuzz.tests.support.helpers import session

# (planted bug, run seed, case index): failing cases of the fuzz loop's first 40 convert cases;
# (convert_logical_width, 2, 2) is the one the case's own seed left at 3 requests.
CASES = [
    ("convert_logical_width", 0, 13),
    ("convert_logical_width", 1, 0),
    ("convert_logical_width", 2, 2),
    ("convert_logical_width", 3, 9),
    ("convert_stride_ignored", 0, 6),
    ("convert_stride_ignored", 1, 1),
]


@pytest.mark.parametrize("impl, run_seed, index", CASES)
def test_a_table_stride_bug_shrinks_to_at_most_two_requests_and_the_shrink_is_complete(impl, run_seed, index):
    s = session()
    config = FuzzConfig(
        ops=("convert",), impls={"convert": impl}, cases=40, seed=run_seed, contract_every=0, rerun_every=0
    )
    task = config.task(index)
    found = [f for f in execute(task, s).findings if f.severity is Severity.ERROR]
    assert found, "the fixed case no longer fails"
    task = dataclasses.replace(task, spec=found[0].spec)
    # The budget is a backstop: on these small cases a shrink ends in about a second.
    result = shrink(task=task, finding=found[0], evaluate=lambda t, _deadline: execute(t, s), budget=120, table=OPS)
    assert result.complete
    assert len(OPS.decode(result.task.spec).requests) <= 2
    again = execute(result.task, s)  # the shrunk task (its seed included) shows the same finding
    assert any(f.kind is found[0].kind and f.cause == found[0].cause for f in again.findings)
