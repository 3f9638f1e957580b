"""After an error input that could corrupt memory (its class is not memory-safe) and that the
implementation ran instead of refusing, the worker is replaced before its next case: heap damage
is never charged, as a CRASH, to a later valid case whose bundle replays clean."""

from __future__ import annotations

from pathlib import Path

from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.drive.workers import WorkerPool
from mlafuzz.harness.drive.workers.crash import memory_unsafe_run
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.findings import Finding, Kind

PLANTED = Path(__file__).parents[2] / "support" / "planted" / "heap_corrupting_convert.py"


def _ran(klass: str) -> TaskResult:
    finding = Finding(
        kind=Kind.ACCEPTED_INVALID_INPUT,
        op="convert",
        impl="x",
        case_id="c",
        message="accepted",
        cause=f"contract:{klass}",
        extra={"invalid_class": klass},
    )
    return TaskResult(findings=(finding,))


def _task(klass: str | None) -> Task:
    return Task(index=0, op="convert", seed=1, impl_ref="x", device="cpu", contract=klass)


def test_only_a_memory_unsafe_class_that_ran_retires_the_worker():
    assert memory_unsafe_run(_task("length_mismatch"), _ran("length_mismatch"), OPS)  # unsafe, ran
    assert not memory_unsafe_run(_task("wrong_dtype"), _ran("wrong_dtype"), OPS)  # ran, but memory-safe
    assert not memory_unsafe_run(_task("length_mismatch"), TaskResult(), OPS)  # unsafe, refused cleanly
    assert not memory_unsafe_run(_task(None), TaskResult(), OPS)  # no error input at all


def test_a_heap_corrupting_convert_charges_no_crash_to_the_valid_case_after_it(tmp_path):
    # Case 1 runs length_mismatch, which the planted convert accepts, "corrupting" its process;
    # its next call, case 2's valid one, would abort in that process. Replaced, it does not.
    config = FuzzConfig(
        ops=("convert",),
        impls={"convert": f"{PLANTED}:convert"},
        cases=3,
        contract_every=2,
        rerun_every=0,
        out_dir=tmp_path / "run",
    )
    assert [config.task(i).contract for i in range(3)] == [None, "length_mismatch", None]
    pool = WorkerPool(devices=["cpu"], timeout=600.0)
    try:
        summary = fuzz(config, executor=pool)
    finally:
        pool.close()
    assert summary.cases == 3 and "CRASH" not in summary.by_kind, summary.by_kind
    assert summary.by_kind["ACCEPTED_INVALID_INPUT"] == 1
    assert summary.worker_restarts == 1
