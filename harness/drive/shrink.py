"""Shrinking a failing case to a small batch that still shows the same finding.

Greedy, Hypothesis-style: the op's reducer (generators/ops/<op>.py ``reduce``)
proposes simpler specs (fewer requests, shorter contexts and queries, fewer
blocks, smaller K, simpler values and layouts); the first proposal on which
the same finding (kind, op, cause) still reproduces is kept and the search
restarts from it, until no proposal helps or the time budget is spent. The
seed is kept, so every step is deterministic. (Hypothesis's own shrinker works
on its choice sequence; our fuzz cases come from a seeded drawer, so we shrink
the spec directly, with the same strategy.)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.reports.findings import Finding


def same_finding(a: Finding, b: Finding) -> bool:
    return (a.kind, a.op, a.cause) == (b.kind, b.op, b.cause)


@dataclass(frozen=True, kw_only=True)
class ShrinkResult:
    task: Task
    finding: Finding
    attempts: int
    accepted: int
    seconds: float


def shrink(*, task: Task, finding: Finding, evaluate: Callable[[Task], TaskResult], budget: float,
           table: OpTable) -> ShrinkResult:
    """The smallest task found within ``budget`` seconds that still shows ``finding`` (``task``
    carries its spec dict)."""
    start = time.monotonic()
    best_task, best_finding = task, finding
    attempts = accepted = 0
    improved = True
    reduce = table.get(task.op).reduce
    while improved and time.monotonic() - start < budget:
        improved = False
        spec = table.decode(best_task.spec)
        for candidate in reduce(spec):
            if time.monotonic() - start >= budget:
                break
            attempts += 1
            trial = dataclasses.replace(best_task, spec=spec_to_dict(candidate))
            result = evaluate(trial)
            match = next((f for f in result.findings if same_finding(f, finding)), None)
            if match is not None:
                best_task, best_finding, improved = trial, match, True
                accepted += 1
                break
    return ShrinkResult(task=best_task, finding=best_finding, attempts=attempts, accepted=accepted,
                        seconds=time.monotonic() - start)
