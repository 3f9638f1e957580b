"""A crash-prone error-input class costs a run one worker restart, not its rate.

The first crash of an implementation in an error-input class is reported once
(CRASH, cause contract:<class>:crash) and the class is quarantined for that
implementation; its later turns go to the next class, and the valid cases run
on. The cost is counted, not timed: summary.json's worker_restarts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.fuzz import FuzzConfig, FuzzSummary, Recorder, shrink_and_bundle
from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.drive.workers import strip_quarantined
from mlafuzz.reports.findings import Finding, Kind

PLANTED = Path(__file__).parents[2] / "support" / "planted"
SEGV = f"{PLANTED / 'segv_on_wrong_dtype_gather.py'}:gather"
CASES = 80  # wrong_dtype comes round once in 3 x 13 cases (13 gather error-input classes)


def _wrong_dtype_turns(impl: str) -> list[int]:
    """The cases of a CASES-case gather run whose error input would be wrong_dtype, unquarantined."""
    config = FuzzConfig(ops=("gather",), impls={"gather": impl}, cases=CASES)
    return [i for i in range(CASES) if config.task(i).contract == "wrong_dtype"]


@pytest.mark.parametrize("impl", [SEGV, "gather_cpp_throw"], ids=["sigsegv", "cpp-throw"])
def test_an_error_input_class_that_kills_its_worker_is_one_crash_one_restart_and_quarantined(impl, tmp_path, capsys):
    assert len(_wrong_dtype_turns(impl)) == 3  # without the quarantine: three crashes, three restarts
    rc = main(
        [
            "fuzz",
            "--op",
            "gather",
            "--impl",
            f"gather={impl}",
            "--device",
            "cpu",
            "--cases",
            str(CASES),
            "--workers",
            "1",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 1
    found = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    crashes = [f for f in found if f["kind"] == "CRASH"]
    assert len(crashes) == 1 and crashes[0]["cause"] == "contract:wrong_dtype:crash", crashes
    assert "wrong_dtype" in crashes[0]["message"] and crashes[0]["extra"]["invalid_class"] == "wrong_dtype"
    assert {f["kind"] for f in found} == {"CRASH"}  # its valid cases are ours: clean
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quarantined"] == [["gather", impl, "wrong_dtype"]]
    assert summary["quarantined_crashes"] == 0 and summary["worker_restarts"] == 1
    assert summary["cases"] == CASES and summary["per_op"] == {"gather": CASES}  # the valid cases ran on
    assert "1 error-input class quarantined, 1 worker restart" in capsys.readouterr().out


class _Pool:
    def __init__(self) -> None:
        self.held: list[frozenset] = []

    def quarantine(self, classes: frozenset) -> None:
        self.held.append(classes)


def _crash(index: int) -> Finding:
    return Finding(
        kind=Kind.CRASH,
        op="gather",
        impl="x",
        case_id=f"c{index}",
        cause="contract:wrong_dtype:crash",
        message="worker killed by SIGSEGV (in its error input wrong_dtype)",
        extra={"part": "contract", "invalid_class": "wrong_dtype"},
    )


def test_a_second_crash_of_a_quarantined_class_is_counted_not_reported(tmp_path):
    """A task queued before the quarantine reached its worker may still crash: counted, no finding."""
    from mlafuzz.reports.jsonl import JsonlSink

    config = FuzzConfig(ops=("gather",), impls={"gather": "x"}, cases=10)
    summary, pool, seen = FuzzSummary(), _Pool(), []
    with JsonlSink(tmp_path / "findings.jsonl") as sink:
        recorder = Recorder(sink, summary, seen.append, pool)
        for i in (1, 4):
            recorder.record(config.task(i), TaskResult(findings=(_crash(i),)))
    assert [f.case_id for f in seen] == ["c1"] and summary.by_kind == {"CRASH": 1}
    assert summary.quarantined == {("gather", "x", "wrong_dtype")} and summary.quarantined_crashes == 1
    assert pool.held == [frozenset({("gather", "x", "wrong_dtype")})]  # broadcast once, to every worker
    assert config.task(40, held=frozenset(summary.quarantined)).contract == "wrong_shape"  # its turn moves on


class _CrashesOnItsClass:
    """An executor whose worker dies in every error input it is given (reported as the pool
    reports it), honouring the quarantine as workers do; it records what it held as each ran."""

    def __init__(self) -> None:
        self.held: frozenset = frozenset()
        self.done: list[tuple[Task, TaskResult]] = []
        self.ran: list[str | None] = []

    def free_slots(self) -> int:
        return 0 if self.done else 1

    def in_flight(self) -> int:
        return len(self.done)

    def submit(self, task: Task) -> None:
        task = strip_quarantined(task, self.held)
        self.ran.append(task.contract)
        self.done.append((task, TaskResult(findings=(_crash(task.index),) if task.contract else ())))

    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]:
        done, self.done = self.done, []
        return done

    def quarantine(self, classes: frozenset) -> None:
        self.held = classes

    def restarts(self) -> int:
        return 0

    def cancel(self) -> None:
        self.done = []

    def close(self) -> None:
        pass


def test_the_crash_of_a_quarantined_class_is_shrunk_with_that_class_run_and_held_again_after(tmp_path):
    # Held while shrinking too, every attempt ran without the class: none could crash, none was kept.
    config = FuzzConfig(ops=("gather",), impls={"gather": "x"}, cases=3, shrink_budget=60.0, out_dir=tmp_path)
    task = config.task(1)
    assert task.contract == "wrong_dtype"
    summary, pool, finding = FuzzSummary(), _CrashesOnItsClass(), _crash(1)
    summary.quarantined = {("gather", "x", "wrong_dtype")}
    pool.quarantine(frozenset(summary.quarantined))
    shrink_and_bundle(config, summary, pool, todo=[(finding.dedup_key, task.with_spec(config.table), finding)])
    (bundle,) = summary.bundles
    shrunk = json.loads((Path(bundle["path"]) / "case.json").read_text())["shrink"]
    assert shrunk["accepted"] >= 1 and set(pool.ran) == {"wrong_dtype"}, (shrunk, set(pool.ran))
    assert pool.held == frozenset(summary.quarantined)  # the fuzz loop's quarantine is back


@pytest.mark.gpu
def test_gpu_gather_cpp_throw_costs_one_restart_and_its_valid_cases_run_on(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "gather",
            "--impl",
            "gather=gather_cpp_throw",
            "--device",
            "cuda",
            "--cases",
            "200",
            "--workers",
            "2",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 1
    found = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    # Infos aside (error inputs outside our CUDA gather's contract that ran: ws0_nonzero, ...), the
    # one failure is the crash of its class.
    assert [f["cause"] for f in found if f["severity"] == "error"] == ["contract:wrong_dtype:crash"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quarantined"] == [["gather", "gather_cpp_throw", "wrong_dtype"]]
    assert summary["worker_restarts"] == 1 and summary["cases"] == 200
