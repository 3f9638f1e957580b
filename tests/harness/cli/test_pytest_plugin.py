"""The pytest plugin: fuzz items per op and implementation, under xdist, with a ledger, on CPU."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlafuzz.harness.pytest_plugin import Worker, gpu_for, impl_label, worker_of

pytest_plugins = ["pytester"]

PLANTED = f"{Path(__file__).parents[2] / 'support' / 'planted' / 'gather_from_zero.py'}:gather"
TWO_BUGS = f"{Path(__file__).parents[2] / 'support' / 'planted' / 'gather_two_bugs.py'}:gather"  # two buckets
# Seed 7 puts a seq_starts case (which the planted gather gets wrong) among the first 4 cases of
# shard 0/1 and the first 8 of each of 2 shards.
SEED = "7"


def _plugin_args() -> list[str]:
    """-p for the plugin, unless its pytest11 entry point already loads it (registering it twice is an error)."""
    installed = any(
        ep.value.startswith("mlafuzz.harness.pytest_plugin") for ep in importlib.metadata.entry_points(group="pytest11")
    )
    # In-process runs meet the plugin module already imported: pytest warns it can't assert-rewrite it. Fine here.
    quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    return quiet if installed else ["-p", "mlafuzz.harness.pytest_plugin", *quiet]


def test_worker_identity_comes_from_xdist_workerinput():
    assert worker_of(SimpleNamespace()) == Worker(name="main", index=0, count=1)
    assert worker_of(SimpleNamespace(workerinput={"workerid": "gw3", "workercount": 4})) == Worker(
        name="gw3", index=3, count=4
    )


@pytest.mark.parametrize("index, gpus, expected", [(0, 1, 0), (3, 1, 0), (3, 2, 1), (5, 4, 1), (2, 8, 2)])
def test_worker_n_takes_visible_gpu_n_modulo_the_count(index, gpus, expected):
    assert gpu_for(Worker(name=f"gw{index}", index=index, count=8), gpus) == expected


def test_impl_labels_are_short_and_safe_for_node_ids_and_paths():
    assert impl_label("torch") == "torch"
    assert impl_label("/a/b/gather_from_zero.py:gather") == "gather_from_zero.py:gather"
    assert impl_label("my_pkg.mod:fn") == "my_pkg.mod:fn"
    assert impl_label("we ird[x]") == "we_ird_x_"


def test_plugin_adds_nothing_without_a_budget(pytester):
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = pytester.runpytest(*_plugin_args(), "--collect-only", "-q")
    assert "mlafuzz::" not in result.stdout.str()
    result.assert_outcomes()  # collect-only: nothing ran, and nothing failed to collect


def test_correct_impl_passes_and_planted_impl_fails_with_finding_and_bundle_replay_under_xdist(pytester):
    # 16 cases in two parts: each part runs the 8 cases of shard k/2 the seed was chosen for.
    result = pytester.runpytest_subprocess(
        *_plugin_args(),
        "-n",
        "2",
        "-rA",
        "--mlafuzz-cases",
        "16",
        "--mlafuzz-seed",
        SEED,
        "--mlafuzz-shrink-budget",
        "0",
        "--mlafuzz-impl",
        "gather=torch",
        "--mlafuzz-impl",
        f"gather={PLANTED}",
        "--mlafuzz-out",
        "out",
    )
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "PASSED mlafuzz::gather[torch-part0of2]" in out and "PASSED mlafuzz::gather[torch-part1of2]" in out
    assert "FAILED mlafuzz::gather[gather_from_zero.py:gather-part0of2]" in out
    assert "VALUE_MISMATCH cause=dst:value" in out and "Mismatched elements" in out
    # Shrinking off still bundles each bucket as found: the replay is that bundle's.
    result.stdout.fnmatch_lines(
        ["*replay: *mlafuzz replay *out/gather-gather_from_zero.py_gather-part[01]of2/bundles/*"]
    )
    dirs = sorted(p.name for p in (pytester.path / "out").iterdir())
    assert len(dirs) == 4 and all(d.rsplit("-", 1)[1] in ("part0of2", "part1of2") for d in dirs)
    assert all((pytester.path / "out" / d / "summary.json").is_file() for d in dirs)


def test_under_xdist_every_op_runs_its_whole_case_set_whichever_worker_takes_which_part(pytester):
    # The must-show: -n 2 --mlafuzz-cases 20 runs each op's first 20 cases, as a run
    # without xdist does, each once; the part (not the worker) decides an item's cases.
    from mlafuzz.harness.drive.fuzz import Shard
    from mlafuzz.harness.drive.mix import Mix

    argv = [*_plugin_args(), "-n", "2", "--mlafuzz-cases", "20", "--mlafuzz-shrink-budget", "0"]
    argv += ["--mlafuzz-impl", "gather=torch", "--mlafuzz-impl", "convert=torch", "--mlafuzz-out", "out"]
    pytester.runpytest_subprocess(*argv).assert_outcomes(passed=4)
    for op in ("gather", "convert"):
        ran = []
        for part in (0, 1):
            folder = pytester.path / "out" / f"{op}-torch-part{part}of2"
            run = json.loads((folder / "run.json").read_text())
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["per_op"] == {op: run["cases"]} and summary["unfinished"] == []  # each ran whole
            k, n = (int(x) for x in run["shard"].split("/"))
            size = Mix.of(tuple(run["shares"]), run["shares"]).size
            shard = Shard(index=k, count=n)
            owned = (i for i in range(10_000) if shard.owns(i, size=size))
            ran += [next(owned) for _ in range(run["cases"])]
        assert sorted(ran) == list(range(20)), (op, ran)


def test_planted_failure_names_the_shrunk_bundles_replay_command(pytester):
    result = pytester.runpytest(
        *_plugin_args(),
        "--mlafuzz-cases",
        "4",
        "--mlafuzz-seed",
        SEED,
        "--mlafuzz-shrink-budget",
        "0.3",
        "--mlafuzz-impl",
        f"gather={PLANTED}",
        "--mlafuzz-out",
        "out",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "collected 1 item",
            "*replay: *mlafuzz replay *out/gather-gather_from_zero.py_gather-main/bundles/*"
            " --impl gather=*gather_from_zero.py:gather",
        ]
    )


def test_ledger_turns_planted_findings_into_expected_ones_and_names_stale_entries(pytester):
    entries = "".join(
        f'[[expected]]\nkind = "{kind}"\nop = "gather"\nimpl = "{TWO_BUGS}"\ncause = "*"\nissue = "https://x/{i}"\n'
        for i, kind in enumerate(("VALUE_MISMATCH", "NAN_MISMATCH", "OOB_WRITE"))
    )
    pytester.makefile(".toml", ledger=entries)
    result = pytester.runpytest(  # seed 3: its 4 cases draw both of the planted gather's buckets
        *_plugin_args(),
        "--mlafuzz-cases",
        "4",
        "--mlafuzz-seed",
        "3",
        "--mlafuzz-shrink-budget",
        "0",
        "--mlafuzz-impl",
        f"gather={TWO_BUGS}",
        "--mlafuzz-ledger",
        "ledger.toml",
        "--mlafuzz-out",
        "out",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*stale ledger entry expected[[]2[]] OOB_WRITE gather=*https://x/2*"])
    assert "expected[0]" not in result.stdout.str() and "expected[1]" not in result.stdout.str()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--mlafuzz-impl", "gather=nosuchimpl"], "no implementation named 'nosuchimpl'"),
        (["--mlafuzz-impl", "softmax=torch"], "unknown op 'softmax'"),
        (["--mlafuzz-budget", "0"], "--mlafuzz-budget=0.0 must be > 0"),
        (["--mlafuzz-cases", "0"], "--mlafuzz-cases=0 must be >= 1"),
        (["--mlafuzz-timeout", "0"], "--mlafuzz-timeout=0.0 must be > 0"),
        (["--mlafuzz-ledger", "missing.toml"], "ledger=missing.toml: no such file"),
    ],
)
def test_bad_plugin_options_are_one_line_usage_errors(pytester, argv, needle):
    result = pytester.runpytest(*_plugin_args(), "--mlafuzz-cases", "1", *argv)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert needle in result.stderr.str()
