"""What a stop keeps: the budget holds against a hanging kernel, and a bucket's bundle exists
whatever ends the run (a SIGTERM while shrinking, --shrink-budget 0).

The planted kernels mark the moment a test must act (a file they create inside the call), so no
test guesses a delay; the only wall-clock test is the one whose promise is a wall-clock bound.
"""

from __future__ import annotations

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


def test_a_hanging_kernel_with_budget_20_and_timeout_10_ends_within_40_s_with_a_summary(tmp_path, monkeypatch):
    spec = tmp_path / "two_requests.json"  # the planted kernel hangs on every 2-request batch
    spec.write_text(spec_to_json(GatherSpec(requests=(GatherRequest(context_len=8, length=8),) * 2)))
    mark, out = tmp_path / "inside-the-call", tmp_path / "run"
    monkeypatch.setenv("MLAFUZZ_TEST_HANG_MARK", str(mark))
    start = time.monotonic()
    rc = main(
        ["fuzz", "--spec", str(spec), "--impl", f"gather={PLANTED / 'hang_gather.py'}:gather", "--device", "cpu"]
        + ["--budget", "20", "--timeout", "10", "--shrink-budget", "0", "--out", str(out), "--quiet"]
    )
    seconds = time.monotonic() - start
    assert seconds < 40, f"the run took {seconds:.1f} s"
    summary = _summary(out)
    assert summary["dropped"] >= 1  # queued cases not started when the budget ended: counted, not run
    assert set(summary["unfinished"]) and summary["interrupted"] is False  # a --resume runs them first
    if mark.exists():  # a worker entered the hanging call (a machine too loaded to start one in 20 s may not)
        assert rc == 1 and summary["by_kind"] == {"TIMEOUT": summary["findings"]}
        assert [c["shrink"]["shrunk"] for c in _bundle_cases(out)] == [False]  # bundled as found


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
