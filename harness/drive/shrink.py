"""Shrinking a failing case to a small batch that still shows the same finding.

Greedy, Hypothesis-style: the op's reducer (generators/ops/<op>.py ``reduce``)
proposes simpler specs (fewer requests, shorter contexts and queries, fewer
blocks, smaller K, simpler values and layouts); the first proposal on which
the same finding (kind, op, cause) still reproduces is kept and the search
restarts from it, until no proposal helps or the time budget is spent. A
proposal is tried under the case's seed first; only when none reproduces so is
each tried under a few other seeds derived from it (``OTHER_SEEDS``): a smaller
spec draws other values, and a bug that shows only on some values would
otherwise leave the shrink at a local minimum. "Complete" means the fixpoint:
no smaller proposal reproduces under any of those seeds. Every seed is derived,
so every step is deterministic.

Shrinking ends: a proposal is tried only when it is strictly smaller than the
case in hand by ``shrink_key`` (generators/reduce.py), a well-founded order on
specs (the sum of their sizes first, then how many options are off their
simplest value). So no two proposals can undo each other (convert's topk_mode
once went VALID, PADDED, VALID... for the whole budget), and even on a case
that always fails the number of accepted steps is bounded.

Why not Hypothesis's shrinker (the issue that asked for this order preferred
it): it shrinks a choice sequence that Hypothesis itself drew, and it has no
public way to start from a case it did not draw. A fuzz case comes from a
seeded ``RandomDrawer`` in a worker, so we would have to re-draw it through
``HypothesisDrawer`` from a recorded choice sequence and drive Hypothesis's
internal engine (private API) with an evaluation that runs out of process,
under a wall-clock budget, and must be stoppable with what it has in hand
(see below). ``hypothesis.find`` searches from scratch instead of shrinking
the case found. So we keep the per-op reducers, made terminating by the order.

A stop (Ctrl-C, SIGTERM) while shrinking does not lose the case in hand: the
result is returned with ``stopped`` set, and the caller writes it and stops.

The budget holds: every attempt runs under the time left (a worker still busy
when it runs out is replaced, its attempt dropped), and an attempt that could
not conclude in time is not started (a TIMEOUT shows only after the run's
per-case limit, so with less time left than that the shrink stops).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable

from mlafuzz.generators.reduce import shrink_key
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.drive.workers import Executor
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.reports.findings import Finding

Evaluate = Callable[[Task, float], "TaskResult | None"]  # (task, deadline on time.monotonic()) -> result


def evaluate_sync(executor: Executor, task: Task, *, deadline: float | None = None) -> TaskResult | None:
    """Run one task to completion on an otherwise idle executor; None when ``deadline`` (a
    ``time.monotonic()`` value) passes first: the task is then dropped (``Executor.cancel``)."""

    def late() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    while not executor.free_slots():
        if late():
            return None
        executor.wait(0.05)
    executor.submit(task)
    while True:
        for done_task, result in executor.wait(0.05):
            if done_task.index == task.index and done_task.spec == task.spec:
                return result
        if late():
            executor.cancel()
            return None


# How many other seeds a proposal is tried under once none reproduces under the case's own. A
# smaller spec draws other values, and where the bug shows only on some (a block table read at the
# wrong row shows only where that row holds another block id), one unlucky draw left the shrink at
# a local minimum (3 requests, or 17 rows, with most of the budget unspent).
OTHER_SEEDS = 4


def _own_seed(seed: int) -> tuple[int, ...]:
    return (seed,)


def _other_seeds(seed: int) -> tuple[int, ...]:
    """``OTHER_SEEDS`` seeds derived from ``seed`` alone, so a shrink stays deterministic."""
    return tuple(
        int.from_bytes(hashlib.sha256(f"mlafuzz-shrink:{seed}:{k}".encode()).digest()[:8], "little") >> 1
        for k in range(1, OTHER_SEEDS + 1)
    )


def same_finding(a: Finding, b: Finding) -> bool:
    return (a.kind, a.op, a.cause) == (b.kind, b.op, b.cause)


@dataclass(frozen=True, kw_only=True)
class ShrinkResult:
    task: Task
    finding: Finding
    attempts: int
    accepted: int
    seconds: float
    complete: bool  # the fixpoint: no smaller proposal reproduces under any seed tried (False: the budget ended it)
    stopped: KeyboardInterrupt | None = None  # the stop that ended the search (the caller re-raises it)


def shrink(
    *,
    task: Task,
    finding: Finding,
    evaluate: Evaluate,
    budget: float,
    table: OpTable,
    attempt_seconds: float = 0.0,
    on_step: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> ShrinkResult:
    """The smallest task found within ``budget`` seconds that still shows ``finding`` (``task``
    carries its spec dict). ``attempt_seconds``: the least time an attempt needs to show the
    finding (a TIMEOUT's limit); ``on_step(attempts, accepted, spec)`` hears every attempt."""
    start = time.monotonic()
    deadline = start + budget
    best_task, best_finding = task, finding
    attempts = accepted = 0
    complete = False
    stopped: KeyboardInterrupt | None = None
    reduce = table.get(task.op).reduce

    def time_for_one() -> bool:
        return deadline - time.monotonic() > attempt_seconds

    def first_reproducing(spec: Any, seeds: Callable[[int], tuple[int, ...]]) -> tuple[Task, Finding] | None | bool:
        """The first smaller proposal (under one of ``seeds(best seed)``) that shows the finding;
        None when none does; False when time ran out first."""
        nonlocal attempts
        key = shrink_key(spec)
        for candidate in reduce(spec):
            if not shrink_key(candidate) < key:
                continue  # not smaller by the order: taking it could undo an earlier step
            for seed in seeds(best_task.seed):
                if not time_for_one():
                    return False
                attempts += 1
                trial = dataclasses.replace(best_task, spec=spec_to_dict(candidate), seed=seed)
                result = evaluate(trial, deadline)
                if result is None:  # out of time mid-attempt
                    return False
                match = next((f for f in result.findings if same_finding(f, finding)), None)
                if on_step is not None:
                    on_step(attempts, accepted + (match is not None), trial.spec if match else best_task.spec)
                if match is not None:
                    return trial, match
        return None

    try:
        while time_for_one():
            spec = table.decode(best_task.spec)
            found: tuple[Task, Finding] | None | bool = None
            for seeds in (_own_seed, _other_seeds):  # the case's own values first; at a minimum, others
                found = first_reproducing(spec, seeds)
                if found is not None:
                    break
            if found is False:
                break
            if found is None:  # no reducer applies under any of the seeds: the fixpoint
                complete = True
                break
            best_task, best_finding = found  # type: ignore[misc]
            accepted += 1
    except KeyboardInterrupt as exc:  # keep what is in hand; the caller writes it, then stops
        stopped, complete = exc, False
    return ShrinkResult(
        task=best_task,
        finding=best_finding,
        attempts=attempts,
        accepted=accepted,
        seconds=time.monotonic() - start,
        complete=complete,
        stopped=stopped,
    )
