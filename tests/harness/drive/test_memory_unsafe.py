"""After an error input that could corrupt memory (its class is not memory-safe) and that the
implementation ran instead of refusing, the worker is replaced before its next case: heap damage
is never charged, as a CRASH, to a later valid case whose bundle replays clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.drive.workers import WorkerPool
from mlafuzz.harness.drive.workers.crash import memory_unsafe_run
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.findings import Finding, Kind
from mlafuzz.tests.support.helpers import HAS_TRITON

PLANTED = Path(__file__).parents[2] / "support" / "planted" / "heap_corrupting_convert.py"
# Damages its process on length_mismatch, then raises out of its kernel's launch (vLLM's DCP filter
# under the interpreter, issue 37): a raise that looked like a refusal kept the damaged worker.
LAUNCH_RAISING = PLANTED.with_name("launch_raising_convert.py")


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


def _fuzz_three(planted: Path, tmp_path: Path):
    # Case 1 runs length_mismatch, which the planted convert runs, "corrupting" its process;
    # its next call, case 2's valid one, would abort in that process. Replaced, it does not.
    config = FuzzConfig(
        ops=("convert",),
        impls={"convert": f"{planted}:convert"},
        cases=3,
        contract_every=2,
        rerun_every=0,
        out_dir=tmp_path / "run",
    )
    assert [config.task(i).contract for i in range(3)] == [None, "length_mismatch", None]
    pool = WorkerPool(devices=["cpu"], timeout=600.0)
    try:
        return fuzz(config, executor=pool)
    finally:
        pool.close()


def test_a_heap_corrupting_convert_charges_no_crash_to_the_valid_case_after_it(tmp_path):
    summary = _fuzz_three(PLANTED, tmp_path)
    assert summary.cases == 3 and "CRASH" not in summary.by_kind, summary.by_kind
    assert summary.by_kind["ACCEPTED_INVALID_INPUT"] == 1
    assert summary.worker_restarts == 1


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_a_convert_that_raised_out_of_its_launch_charges_no_crash_to_the_valid_case_after_it(tmp_path):
    # The raise is no refusal: the error input is ACCEPTED_INVALID_INPUT, the worker retires.
    summary = _fuzz_three(LAUNCH_RAISING, tmp_path)
    assert summary.cases == 3 and "CRASH" not in summary.by_kind, summary.by_kind
    (accepted,) = [f for _, f in summary.buckets.values()]
    assert accepted.kind is Kind.ACCEPTED_INVALID_INPUT and accepted.cause == "contract:length_mismatch"
    assert "out of its kernel's launch" in accepted.message
    assert summary.worker_restarts == 1
