"""A run's life as CI sees it: a worker dies with its parent (kill -9), SIGTERM stops the run with
its summary written, and workers end quietly whatever ends them.

The planted hanging gather (tests/support/planted/hang_gather.py) creates a marker file when a
worker enters its hanging call, so each test acts at that moment without guessing a delay; the
deadlines are generous upper bounds for a loaded machine, never the thing a test measures.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.spec import spec_to_json

HANG = Path(__file__).parents[2] / "support" / "planted" / "hang_gather.py"
START_DEADLINE = 180.0  # spawning a worker and importing torch, on a busy 2-core machine
GONE_DEADLINE = 5.0  # what the issue asks: no mlafuzz process left 5 s after the parent is gone


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it no longer exists."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st[1]
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    """The ones still running (a zombie waiting for its reaper has ended)."""
    return {pid for pid in pids if (st := _stat(pid)) is not None and st[0] != "Z"}


def _wait_until(check, deadline: float, step: float = 0.1) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(step)
    return check()


def _start_hanging_run(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A worker-pool run whose first case hangs inside the implementation; returns once a worker
    is in that call."""
    spec = tmp_path / "two_requests.json"
    spec.write_text(
        spec_to_json(
            GatherSpec(requests=(GatherRequest(context_len=8, length=8), GatherRequest(context_len=8, length=8)))
        )
    )
    mark = tmp_path / "inside-the-call"
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
            f"gather={HANG}:gather",
            "--device",
            "cpu",
            "--cases",
            "2",
            "--workers",
            "1",
            "--timeout",
            "600",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if not _wait_until(lambda: mark.exists() or proc.poll() is not None, START_DEADLINE, step=0.2):
        proc.kill()
        raise AssertionError("no worker entered the hanging call")
    assert proc.poll() is None, proc.communicate()
    return proc, mark


def test_kill_9_of_the_main_process_mid_case_leaves_no_mlafuzz_process_after_5_s(tmp_path):
    proc, mark = _start_hanging_run(tmp_path)
    family = _descendants(proc.pid)
    assert int(mark.read_text()) in family  # a worker, inside the case, is what must not linger
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert _wait_until(lambda: not _alive(family), GONE_DEADLINE), f"still running: {_alive(family)}"


def test_sigterm_mid_case_writes_the_summary_ends_the_workers_and_exits_143(tmp_path):
    proc, mark = _start_hanging_run(tmp_path)
    family = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (out, err)
    assert err.strip() == "", err  # no traceback, from the parent or a worker
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["terminated"] is True
    assert summary["unfinished"] == [0, 1]  # the case it was in and the one queued: a --resume runs them first
    assert "[interrupted]" in out
    assert _wait_until(lambda: not _alive(family), GONE_DEADLINE), f"still running: {_alive(family)}"


def test_an_idle_worker_whose_parent_goes_away_exits_0_and_prints_nothing(capfd):
    from mlafuzz.harness.drive.workers.bootstrap import worker_main as _worker_main
    from mlafuzz.harness.drive.workers.protocol import DEFAULT_TABLE

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    state = ctx.RawArray("d", 3)
    worker = ctx.Process(
        target=_worker_main, args=(child, state, "cpu", False, 1, DEFAULT_TABLE, os.getpid()), daemon=True
    )
    worker.start()
    child.close()
    assert parent.poll(START_DEADLINE) and parent.recv() == ("ready", None)
    capfd.readouterr()
    parent.close()  # what the worker sees when its parent dies: the pipe's far end is gone
    worker.join(timeout=60)
    assert worker.exitcode == 0
    assert capfd.readouterr().err == ""
