"""Shrinking holds its budget: an attempt that cannot conclude in the time left is not started, one
still running when the time is up is dropped, and every attempt is heard (progress)."""

from __future__ import annotations

import time

from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.shrink import evaluate_sync, shrink
from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.findings import Finding, Kind

SPEC = GatherSpec(
    requests=(
        GatherRequest(context_len=40, length=30),
        GatherRequest(context_len=20, length=20),
        GatherRequest(context_len=9, length=9),
    )
)


def _task(impl: str) -> Task:
    return Task(index=0, op="gather", seed=3, impl_ref=impl, device="cpu", spec=spec_to_dict(SPEC))


def _never(task: Task, deadline: float) -> TaskResult:
    raise AssertionError("no attempt should have been made")


def test_a_timeout_that_cannot_show_in_the_time_left_is_not_attempted():
    finding = Finding(kind=Kind.TIMEOUT, op="gather", impl="x", case_id="c", message="hang", cause="timeout")
    result = shrink(task=_task("x"), finding=finding, evaluate=_never, budget=1.0, table=OPS, attempt_seconds=2.0)
    assert result.attempts == 0 and result.complete is False and result.task == _task("x")


def test_an_attempt_that_runs_out_of_time_ends_the_shrink_with_the_best_so_far():
    finding = Finding(kind=Kind.MISSING_WRITE, op="gather", impl="x", case_id="c", message="m", cause="dst:missing")
    result = shrink(task=_task("x"), finding=finding, evaluate=lambda task, deadline: None, budget=60.0, table=OPS)
    assert result.attempts == 1 and result.accepted == 0 and result.complete is False


def test_a_shrink_reports_every_attempt_and_ends_complete_at_a_local_minimum():
    session = Session(table=OPS)
    executor = InProcess(session=session)
    task = _task("gather_skip_last_row")
    (finding,) = evaluate_sync(executor, task).findings
    heard = []
    result = shrink(
        task=task,
        finding=finding,
        evaluate=lambda t, deadline: evaluate_sync(executor, t, deadline=deadline),
        budget=600.0,
        table=OPS,
        on_step=lambda attempts, accepted, spec: heard.append((attempts, accepted)),
    )
    assert result.complete and result.accepted >= 1
    assert heard[-1] == (result.attempts, result.accepted) and [a for a, _ in heard] == list(
        range(1, result.attempts + 1)
    )
    assert len(OPS.decode(result.task.spec).requests) == 1


def test_evaluate_past_its_deadline_drops_the_task_and_answers_none():
    class Silent(InProcess):
        """Takes a task and never answers (a hanging case)."""

        cancelled = 0

        def submit(self, task: Task) -> None:
            self.held = task

        def wait(self, timeout: float) -> list:
            return []

        def in_flight(self) -> int:
            return 1 if getattr(self, "held", None) else 0

        def cancel(self) -> None:
            self.cancelled += 1
            self.held = None

    executor = Silent(session=Session(table=OPS))
    assert evaluate_sync(executor, _task("torch"), deadline=time.monotonic()) is None
    assert executor.cancelled == 1 and executor.in_flight() == 0
