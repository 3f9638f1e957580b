"""What a stop keeps: the budget holds against a hanging kernel, and a bucket's bundle exists
whatever ends the run (a SIGTERM while shrinking, --shrink-budget 0).

The planted kernels mark the moment a test must act (a file they create inside the call), so no
test guesses a delay; the budget's own promise is checked on a fake clock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.spec import spec_to_json
from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive import fuzz as fuzz_module
from mlafuzz.harness.drive.budget import GRACE_SECONDS
from mlafuzz.harness.drive.fuzz import FuzzConfig
from mlafuzz.harness.drive.tasks import TaskResult
from mlafuzz.harness.drive.workers import WorkerPool, drop_queued
from mlafuzz.reports.findings import Finding, Kind

PLANTED = Path(__file__).parents[2] / "support" / "planted"
START_DEADLINE = 180.0  # spawning a worker and importing torch, on a busy 2-core machine

# Wrong on every case (one added to every row it copies); on 1..7 rows, which only a shrink of
# the 3-request, 24-row case below offers (after it has taken 8 rows), it marks and hangs.
SHRINK_HANG = """
import os, time
from pathlib import Path
from mlafuzz.kernels.torch_impl import gather_torch

def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    if 0 < dst.shape[0] < 8:
        Path(os.environ["MLAFUZZ_TEST_HANG_MARK"]).write_text(str(os.getpid()))
        while True:
            time.sleep(1)
    dst.view(-1)[:1].add_(1)
"""


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _bundle_cases(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "bundles").glob("*/case.json"))]


def _two_request_gather(tmp_path: Path, *, cases: int | None = None, budget: float | None = None, **kw):
    """A run of the planted kernel that hangs on every 2-request batch, on that batch only."""
    spec = GatherSpec(requests=(GatherRequest(context_len=8, length=8),) * 2)
    return FuzzConfig(
        ops=("gather",),
        impls={"gather": f"{PLANTED / 'hang_gather.py'}:gather"},
        fixed_spec=spec,
        cases=cases,
        budget=budget,
        shrink_budget=0.0,
        out_dir=tmp_path / "run",
        **kw,
    )


def test_a_pool_gives_back_the_cases_no_worker_started_and_charges_the_hanging_one_as_timeout(tmp_path, monkeypatch):
    # What the budget's end asks of the real pool: three cases queued on one worker, the first
    # inside the hanging call (its mark says so: no delay guessed); the two not started come back,
    # and the running one ends as a TIMEOUT once its --timeout is spent.
    mark = tmp_path / "inside-the-call"
    monkeypatch.setenv("MLAFUZZ_TEST_HANG_MARK", str(mark))
    config = _two_request_gather(tmp_path, cases=3)
    pool = WorkerPool(devices=["cpu"], timeout=5.0)
    results = []
    try:
        deadline = time.monotonic() + START_DEADLINE  # a safety net, not the behaviour under test
        while pool.free_slots() < 3 and time.monotonic() < deadline:  # the worker is ready
            results += pool.wait(0.2)
        for i in range(3):
            pool.submit(config.task(i))
        while not mark.exists() and time.monotonic() < deadline:
            results += pool.wait(0.2)
        assert mark.exists(), "no worker entered the hanging call"
        assert sorted(t.index for t in drop_queued(pool)) == [1, 2]
        while pool.in_flight() and time.monotonic() < deadline:
            results += pool.wait(0.2)
    finally:
        pool.close()
    assert [(t.index, [f.kind for f in r.findings]) for t, r in results] == [(0, [Kind.TIMEOUT])]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _HangingPool:
    """An executor on a fake clock: one case runs at a time, each hangs until ``limit`` seconds
    after it started and then ends as a TIMEOUT, as the worker pool ends a hanging call."""

    def __init__(self, clock: _Clock, *, limit: float, depth: int = 3) -> None:
        self.clock, self.limit, self.depth = clock, limit, depth
        self.queue: list = []
        self.started = 0.0
        self.submitted_at: list[float] = []

    def free_slots(self) -> int:
        return self.depth - len(self.queue)

    def in_flight(self) -> int:
        return len(self.queue)

    def submit(self, task) -> None:
        if not self.queue:
            self.started = self.clock.now
        self.queue.append(task)
        self.submitted_at.append(self.clock.now)

    def drop_queued(self) -> list:
        dropped, self.queue = self.queue[1:], self.queue[:1]
        return dropped

    def wait(self, timeout: float) -> list:
        self.clock.now += timeout
        if not self.queue or self.clock.now - self.started < self.limit:
            return []
        task = self.queue.pop(0)
        self.started = self.clock.now
        finding = Finding(
            kind=Kind.TIMEOUT,
            op=task.op,
            impl=task.impl_ref,
            case_id=f"case-{task.index}",
            message="hung",
            cause="hang",
        )
        return [(task, TaskResult(findings=(finding,)))]

    def quarantine(self, classes) -> None:
        pass

    def restarts(self) -> int:
        return 0

    def cancel(self) -> None:
        self.queue = []

    def close(self) -> None:
        pass


def test_a_budget_of_20_with_a_timeout_of_8_against_a_hanging_kernel_ends_within_its_grace_with_a_summary(
    tmp_path, monkeypatch
):
    # The loop's promise on a fake clock (so no machine's speed enters): no case starts after the
    # budget, the cases still queued are dropped, and the one running gets the grace (the smaller
    # of its timeout and GRACE_SECONDS), then is cut: unfinished, kept for a resume, no TIMEOUT.
    clock = _Clock()
    monkeypatch.setattr(fuzz_module, "time", clock)
    pool = _HangingPool(clock, limit=8.0)
    summary = fuzz_module.fuzz(_two_request_gather(tmp_path, budget=20.0, timeout=8.0), executor=pool)
    assert clock.now <= 20.0 + GRACE_SECONDS + 0.1 + 1e-9, clock.now
    assert max(pool.submitted_at) < 20.0
    assert summary.by_kind == {"TIMEOUT": summary.findings} and summary.findings == 2  # at 8 s and 16 s
    assert summary.dropped == 2 and summary.cut == 1
    assert set(summary.unfinished) >= set(range(summary.next_case)) - {0, 1}  # dropped and cut: a resume runs them
    saved = _summary(tmp_path / "run")
    assert saved["dropped"] == 2 and saved["cut"] == 1 and saved["interrupted"] is False


def test_a_case_that_times_out_within_the_grace_is_a_timeout_not_a_cut(tmp_path, monkeypatch):
    # --timeout 2 is shorter than the grace: the case running at the budget's end has its whole
    # --timeout, so a hang there is a TIMEOUT finding, and nothing is cut.
    clock = _Clock()
    monkeypatch.setattr(fuzz_module, "time", clock)
    pool = _HangingPool(clock, limit=2.0)
    summary = fuzz_module.fuzz(_two_request_gather(tmp_path, budget=5.0, timeout=2.0), executor=pool)
    assert clock.now <= 5.0 + 2.0 + 0.1 + 1e-9, clock.now
    assert summary.cut == 0 and summary.findings == 3  # at 2, 4 and 6 s


def test_shrink_budget_0_still_writes_each_buckets_bundle_as_found(tmp_path):
    out = tmp_path / "run"
    rc = main(
        [
            "fuzz",
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--in-process",
            "--cases",
            "40",
            "--shrink-budget",
            "0",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 1
    summary = _summary(out)
    assert len(summary["bundles"]) == summary["buckets"] >= 1
    for entry in summary["bundles"]:
        case = json.loads((Path(entry["path"]) / "case.json").read_text())
        assert case["shrink"]["shrunk"] is False and case["shrink"]["attempts"] == 0
        assert (Path(entry["path"]) / "inputs.pt").is_file()


def test_sigterm_while_shrinking_keeps_the_smallest_case_in_hand_as_the_bundle(tmp_path):
    impl = tmp_path / "wrong_then_hangs.py"
    impl.write_text(SHRINK_HANG)
    spec = tmp_path / "three_requests.json"
    spec.write_text(spec_to_json(GatherSpec(requests=(GatherRequest(context_len=8, length=8),) * 3)))
    mark, out = tmp_path / "inside-a-shrink-attempt", tmp_path / "run"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1", MLAFUZZ_TEST_HANG_MARK=str(mark))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlafuzz.harness.cli.main",
            "fuzz",
            "--spec",
            str(spec),
            "--impl",
            f"gather={impl}:gather",
        ]
        + ["--device", "cpu", "--cases", "2", "--workers", "1", "--timeout", "600", "--shrink-budget", "600"]
        + ["--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    end = time.monotonic() + START_DEADLINE
    while not mark.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    if not mark.exists():
        proc.kill()
        raise AssertionError(f"no shrink attempt reached the hanging call: {proc.communicate()}")
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, (stdout, stderr)  # a finding's status wins over the stop's (143)
    assert "[interrupted]" in stdout
    summary = _summary(out)
    assert summary["interrupted"] is True and summary["terminated"] is True
    [case] = _bundle_cases(out)
    assert case["shrink"]["stopped"] is True and case["shrink"]["accepted"] >= 1
    assert len(case["spec"]["spec"]["requests"]) == 1  # the smaller case in hand, not the 3-request one found
    assert [b["path"] for b in summary["bundles"]] == [str(out / "bundles" / Path(summary["bundles"][0]["path"]).name)]


def test_once_a_bucket_waits_cases_stop_early_enough_to_shrink_it_inside_the_budget(tmp_path, monkeypatch):
    # Every case is a TIMEOUT after 1 s (a new bucket at once): with a 20 s budget and a shrink
    # budget of 8, the reserve is min(8, 20 / 4) = 5 s, so no case starts at or after 15 s, and
    # shrinking is handed the budget's end as its deadline.
    clock = _Clock()
    monkeypatch.setattr(fuzz_module, "time", clock)
    handed = []
    monkeypatch.setattr(fuzz_module, "shrink_and_bundle", lambda *a, **kw: handed.append(kw["deadline"]))
    pool = _HangingPool(clock, limit=1.0)
    config = dataclasses.replace(_two_request_gather(tmp_path, budget=20.0, timeout=1.0), shrink_budget=8.0)
    fuzz_module.fuzz(config, executor=pool)
    assert 13.0 < max(pool.submitted_at) < 15.0 and handed == [20.0]


def test_a_bucket_left_no_time_by_the_budget_keeps_its_bundle_as_found(tmp_path):
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.workers import InProcess
    from mlafuzz.harness.ops.table import OPS

    config = dataclasses.replace(_two_request_gather(tmp_path, cases=1), impls={"gather": "gather_skip_last_row"})
    executor = InProcess(session=Session(table=OPS))
    summary = fuzz_module.fuzz(config, executor=executor)
    assert len(summary.bundles) == 1
    heard = []
    fuzz_module.shrink_and_bundle(
        dataclasses.replace(config, shrink_budget=600.0),
        summary,
        executor,
        on_shrink=lambda event, facts: heard.append((event, facts.get("note"))),
        deadline=time.monotonic() - 1.0,
    )
    assert heard[-1] == ("done", "the budget has ended: bundled as found")
    (case,) = _bundle_cases(tmp_path / "run")
    assert case["shrink"]["attempts"] == 0 and case["shrink"]["shrunk"] is False
