"""From a finding to a fix and back: a folder of bundles replays as a regression suite, a nightly
run replays its corpus before it fuzzes, --max-findings stops early, and a bundle opens in a
debugger (replay --pdb, or three lines of Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main

PLANTED = Path(__file__).parents[2] / "support" / "planted" / "gather_from_zero.py"
BUGGY = f"gather={PLANTED}:gather"
GATHER = ["fuzz", "--op", "gather", "--device", "cpu", "--in-process", "--seed", "0"]


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> Path:
    """A run of the planted gather with its one bundle (the bucket the planted bug makes)."""
    out = tmp_path_factory.mktemp("found") / "run"
    assert main([*GATHER, "--impl", BUGGY, "--cases", "12", "--out", str(out), "--shrink-budget", "2", "--quiet"]) == 1
    assert len(list((out / "bundles").iterdir())) == 1
    return out


def test_replaying_a_folder_of_bundles_is_a_regression_suite(found, capsys):
    assert main(["replay", str(found / "bundles"), "--impl", BUGGY]) == 1
    out = capsys.readouterr().out
    assert "still failing" in out.splitlines()[-1] and "VALUE_MISMATCH" in out
    assert main(["replay", str(found), "--impl", "gather=torch"]) == 0  # the run folder works too; fixed
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "mlafuzz replay: 1 bundle: 0 still failing, 1 fixed"
    assert "fixed" in out.splitlines()[1]


def test_corpus_bundles_run_first_count_in_the_run_and_each_says_fixed_or_still_failing(found, tmp_path, capsys):
    (bundle,) = (found / "bundles").iterdir()
    case = json.loads((bundle / "case.json").read_text())
    kind = json.loads((bundle / "finding.json").read_text())["kind"]
    out = tmp_path / "nightly"
    args = [*GATHER, "--impl", BUGGY, "--cases", "2", "--out", str(out), "--corpus", str(found / "bundles")]
    assert main([*args, "--shrink-budget", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "replaying 1 corpus bundle from" in err
    assert f"mlafuzz: --corpus: {bundle.name}: still fails: {kind}" in err.splitlines()
    first = json.loads((out / "findings.jsonl").read_text().splitlines()[0])
    assert first["seed"] == case["seed"] and first["spec"] == case["spec"]  # last night's failure, first
    assert json.loads((out / "summary.json").read_text())["cases"] == 3  # the corpus case, then 2 new ones
    # Fixed: the corpus replays clean, the run goes on to its own cases.
    fixed = tmp_path / "fixed"
    assert main([*GATHER, "--impl", "gather=torch", "--cases", "2", "--out", str(fixed), "--corpus", str(found)]) == 0
    assert json.loads((fixed / "summary.json").read_text())["cases"] == 3
    assert f"mlafuzz: --corpus: {bundle.name}: fixed" in capsys.readouterr().err.splitlines()


def test_a_nightly_job_can_replay_its_own_last_run_folder_into_itself(found, tmp_path, capsys):
    import shutil

    out = tmp_path / "nightly"
    shutil.copytree(found, out)
    args = [*GATHER, "--impl", BUGGY, "--cases", "1", "--out", str(out), "--corpus", str(out), "--overwrite"]
    assert main([*args, "--shrink-budget", "0.5"]) == 1  # read before the folder is cleared
    assert "replaying 1 corpus bundle from" in capsys.readouterr().err
    assert len(list((out / "bundles").iterdir())) == 1


def test_a_corpus_folder_without_bundles_a_clean_night_runs_nothing_first_and_fuzzes(tmp_path, capsys):
    clean = tmp_path / "merged"  # merge of a clean night: a run folder with no bundles/
    clean.mkdir()
    out = tmp_path / "run"
    assert main([*GATHER, "--impl", "gather=torch", "--cases", "2", "--out", str(out), "--corpus", str(clean)]) == 0
    assert "replaying 0 corpus bundles from" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["cases"] == 2
    # A corpus that is not there at all is a mistake (a typo in the path): one line, exit 2.
    assert (
        main(
            [
                *GATHER,
                "--impl",
                "gather=torch",
                "--cases",
                "2",
                "--out",
                str(out),
                "--overwrite",
                "--corpus",
                str(tmp_path / "nope"),
            ]
        )
        == 2
    )


def test_max_findings_stops_the_run_after_n_failing_buckets(tmp_path, capsys):
    out = tmp_path / "run"
    args = [*GATHER, "--impl", BUGGY, "--cases", "200", "--out", str(out), "--shrink-budget", "0", "--quiet"]
    assert main([*args, "--max-findings", "1"]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["buckets"] == 1 and summary["cases"] < 200


def test_replay_pdb_stops_before_the_implementations_call(found):
    (bundle,) = (found / "bundles").iterdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mlafuzz.harness.cli", "replay", str(bundle), "--impl", BUGGY, "--pdb"],
        input="p fn.__name__\nc\nc\nc\nc\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr
    assert "stopped before the call of gather; s steps in" in run.stdout
    assert "(Pdb) 'gather'" in run.stdout  # the debugger is at the call, with the implementation in hand
    assert "reproduces" in run.stdout


def test_replay_pdb_steps_into_the_implementation_with_one_s(found):
    (bundle,) = (found / "bundles").iterdir()
    run = subprocess.run(
        [sys.executable, "-m", "mlafuzz.harness.cli", "replay", str(bundle), "--impl", BUGGY, "--pdb"],
        input="s\np __file__\nc\nc\nc\nc\n",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr
    # After one `s`, the frame pdb is in is the planted gather's own.
    assert f"(Pdb) {str(PLANTED)!r}" in run.stdout, run.stdout


def test_the_readme_snippet_loads_a_bundle_and_calls_a_function(found, tmp_path):
    (bundle,) = (found / "bundles").iterdir()
    snippet = (
        "from mlafuzz.harness.drive.replay import load_bundle_call\n"
        f"call = load_bundle_call({str(bundle)!r})\n"
        "out = call(my_gather)  # set a breakpoint in my_gather; call.expected() is what it should return\n"
    )
    user = (
        "import importlib.util, torch\n"
        f"spec = importlib.util.spec_from_file_location('bug', {str(PLANTED)!r})\n"
        "bug = importlib.util.module_from_spec(spec); spec.loader.exec_module(bug)\n"
        "my_gather = bug.gather\n"
        + snippet
        + "assert not torch.equal(out['dst'].view(torch.int16), call.expected()['dst'].view(torch.int16))\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", user], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_the_snippet_on_a_correct_function_returns_what_the_oracle_does(found):
    import torch

    from mlafuzz.harness.drive.replay import load_bundle_call
    from mlafuzz.kernels.registry import default_registry

    (bundle,) = (found / "bundles").iterdir()
    call = load_bundle_call(bundle)
    ours = default_registry().get("gather", "torch").load("cpu")
    got, want = call(ours)["dst"], call.expected()["dst"]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_the_shards_of_a_run_split_one_corpus_between_them(found, tmp_path):
    import shutil

    from mlafuzz.harness.drive.replay import corpus_tasks

    (bundle,) = (found / "bundles").iterdir()
    for name in ("a", "b", "c"):
        shutil.copytree(bundle, tmp_path / name)
    common = {"impls": {"gather": "torch"}, "device": "cpu", "ulp": 0, "revision": "2026-09", "rejects": {}}
    shares = [corpus_tasks(tmp_path, **common, shard=(k, 2))[0] for k in (0, 1)]
    assert [len(s) for s in shares] == [2, 1]
    whole, notes, names = corpus_tasks(tmp_path, **common)
    assert len(whole) == 3 and notes == [] and sorted(names.values()) == ["a", "b", "c"]
