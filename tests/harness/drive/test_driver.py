"""The fuzz driver as a nightly job meets it: dying and hanging impls, shrinking, bundles, replay, shards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.fuzz import FuzzConfig, Shard
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.invocation import command

PLANTED = Path(__file__).parents[2] / "support" / "planted"


def _findings(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "findings.jsonl").read_text().splitlines()]


# The dying kernel's run gets a --timeout no case on a loaded 2-core machine reaches by accident
# (a false TIMEOUT there failed this test); the hanging one's must pass, so it is short.
@pytest.mark.parametrize(
    "planted, kind, timeout", [("abort_gather.py", "CRASH", "120"), ("hang_gather.py", "TIMEOUT", "3")]
)
def test_dying_or_hanging_impl_is_reported_and_the_run_goes_on_to_its_last_case(
    planted, kind, timeout, tmp_path, capsys
):
    rc = main(
        [
            "fuzz",
            "--impl",
            f"gather={PLANTED / planted}:gather",
            "--device",
            "cpu",
            "--cases",
            "10",
            "--timeout",
            timeout,
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 1
    found = _findings(tmp_path)
    assert {f["kind"] for f in found} == {kind}
    assert all(f["spec"] and f["seed"] is not None for f in found)  # each names the case that did it
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cases"] == 10 and 0 < len(found) < 10  # every case ran, the ones after a failure too


def test_single_request_bug_shrinks_to_at_most_two_requests_and_replays(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "40",
            "--shrink-budget",
            "15",
            "--out",
            str(tmp_path),
            "--quiet",
            "--in-process",
        ]
    )
    assert rc == 1
    bundles = sorted((tmp_path / "bundles").iterdir())
    assert bundles
    for bundle in bundles:
        case = json.loads((bundle / "case.json").read_text())
        assert len(case["spec"]["spec"]["requests"]) <= 2
        assert (bundle / "replay.txt").read_text().startswith(command("replay") + " ")
        assert case["shrink"]["loop_oracle_agrees"] is True
    out = capsys.readouterr().out
    assert "repro (" not in out  # --quiet: the summary and verdict only; replay.txt holds the line
    capsys.readouterr()
    assert main(["replay", str(bundles[0])]) == 2  # the bundle names a file: not imported on its word
    assert "--trust-bundle" in capsys.readouterr().err
    assert main(["replay", str(bundles[0]), "--trust-bundle"]) == 1  # still broken
    assert main(["replay", str(bundles[0]), "--impl", "gather=torch"]) == 0  # the fix passes


def test_tampered_or_malformed_bundles_exit_2_with_one_line(tmp_path, capsys):
    import torch

    main(
        [
            "fuzz",
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "10",
            "--shrink-budget",
            "2",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--in-process",
        ]
    )
    bundle = next((tmp_path / "run" / "bundles").iterdir())
    capsys.readouterr()
    inputs = torch.load(bundle / "inputs.pt", weights_only=True)
    inputs["block_table"] = inputs["block_table"] + 1
    torch.save(inputs, bundle / "inputs.pt")
    assert main(["replay", str(bundle)]) == 2
    assert "does not match" in capsys.readouterr().err

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, bundle / "inputs.pt")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert main(["replay", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert "refused to load" in err and len(err.strip().splitlines()) == 1
    assert "GLOBAL" in err and "Weights only load failed" not in err  # what was refused, not torch's advice
    assert not [w for w in warned if issubclass(w.category, UserWarning)]
    assert main(["replay", str(tmp_path / "nope")]) == 2


def test_shards_split_the_case_space_into_disjoint_slices():
    def indices(shard: Shard) -> set[int]:
        return {i for i in range(100) if shard.owns(i)}

    a, b, c = (indices(Shard(index=k, count=3)) for k in range(3))
    assert not (a & b or b & c or a & c) and a | b | c == set(range(100))
    config = FuzzConfig(ops=("convert", "gather"), impls={"convert": "torch", "gather": "torch"}, cases=1)
    assert config.task(7) == config.task(7)  # a task is a pure function of (seed, index)


def test_interrupted_run_leaves_valid_findings_and_a_summary(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlafuzz.harness.cli.main",
            "fuzz",
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "1000000",  # far more than it can run before the signal: the run is mid-way when stopped
            "--out",
            str(tmp_path),
            "--in-process",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    findings = tmp_path / "findings.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (findings.exists() and findings.stat().st_size > 0):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "[interrupted]" in out
    assert all(json.loads(line)["kind"] for line in findings.read_text().splitlines())
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"] is True


@pytest.mark.gpu
def test_a_case_that_breaks_the_cuda_context_is_a_crash_and_later_cases_run_in_a_fresh_worker(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "gather",
            "--impl",
            f"gather={PLANTED / 'illegal_address_gather.py'}:gather",
            "--device",
            "cuda",
            "--workers",
            "1",
            "--cases",
            "60",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 1
    found = _findings(tmp_path)
    assert found and {f["kind"] for f in found} == {"CRASH"}
    assert {f["cause"] for f in found} <= {"cuda_context", "crash"}  # never a harness error of a poisoned worker
    assert all(len(f["spec"]["spec"]["requests"]) == 3 for f in found)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cases"] == 60 and summary["findings"] < 60


def test_a_fault_that_broke_the_cuda_context_is_one_crash_not_also_a_launch_error():
    # An illegal address surfaces in the harness's next CUDA op (a LAUNCH_ERROR on its own); when
    # the worker then finds its context broken, that same fault is the case's one CRASH.
    from mlafuzz.harness.drive.tasks import Task, TaskResult
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, charge_broken_context, table_from_ref
    from mlafuzz.reports.findings import Finding, Kind

    task = Task(index=3, op="gather", seed=9, impl_ref="torch", device="cuda:0")
    surfaced = Finding(
        kind=Kind.LAUNCH_ERROR, op="gather", impl="torch", case_id="c", cause="cuda_error_after_call", message="m"
    )
    other = Finding(kind=Kind.VALUE_MISMATCH, op="gather", impl="torch", case_id="c", cause="dst:value", message="m")
    result = charge_broken_context(
        task,
        TaskResult(findings=(surfaced, other)),
        "AcceleratorError: CUDA error: an illegal memory access was encountered",
        table_from_ref(DEFAULT_TABLE),
    )
    assert [(f.kind, f.cause) for f in result.findings] == [
        (Kind.VALUE_MISMATCH, "dst:value"),
        (Kind.CRASH, "cuda_context"),
    ]


def test_a_context_broken_by_the_error_input_is_charged_to_its_class_not_to_the_valid_case():
    # The worker syncs before a task's error input: a context that still worked then was broken by
    # that input, and the CRASH names its class (the valid case's bundle would replay clean).
    from mlafuzz.harness.drive.tasks import Task, TaskResult
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, charge_broken_context, table_from_ref

    task = Task(index=3, op="convert", seed=9, impl_ref="torch", device="cuda:0", contract="bad_block_size")
    table = table_from_ref(DEFAULT_TABLE)
    error = "AcceleratorError: CUDA error: an illegal memory access was encountered"
    [crash] = charge_broken_context(task, TaskResult(), error, table, in_contract=True).findings
    assert crash.cause == "contract:bad_block_size:crash" and "in its error input bad_block_size" in crash.message
    assert crash.extra["invalid_class"] == "bad_block_size"
    [valid] = charge_broken_context(task, TaskResult(), error, table).findings
    assert valid.cause == "cuda_context"


def test_each_of_4_shards_fuzzes_every_op_in_the_unsharded_mix(tmp_path):
    mix = FuzzConfig(ops=OPS.names, impls=dict.fromkeys(OPS.names, "torch"), cases=1).mix
    for k in range(4):
        out = tmp_path / f"shard{k}"
        assert (
            main(
                [
                    "fuzz",
                    "--device",
                    "cpu",
                    "--cases",
                    str(mix.size),  # one round: each op its share
                    "--shard",
                    f"{k}/4",
                    "--in-process",
                    "--shrink-budget",
                    "0",
                    "--quiet",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        summary = json.loads((out / "summary.json").read_text())
        assert summary["per_op"] == mix.to_json(), (k, summary["per_op"])


def test_the_shards_of_a_run_together_are_the_unsharded_run():
    ops = ("convert", "gather", "writer", "step")
    config = FuzzConfig(ops=ops, impls={op: "torch" for op in ops}, cases=1, seed=11)

    def first_tasks(shard: Shard, n: int) -> list:
        owned = (i for i in range(10_000) if shard.owns(i, size=config.mix.size))
        return [config.task(next(owned)) for _ in range(n)]

    size = config.mix.size  # shards own whole rounds: 4 shards' first round each are the run's first 4
    unsharded = first_tasks(Shard(), 4 * size)
    shards = [first_tasks(Shard(index=k, count=4), size) for k in range(4)]
    assert sorted(t.index for s in shards for t in s) == [t.index for t in unsharded]
    assert {t for s in shards for t in s} == set(unsharded)
