"""--shard auto: a CI job's copies find their slice of the case space without flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.campaign import shard_from_env

PLANTED = Path(__file__).parents[2] / "support" / "planted"
CI_VARIABLES = ("MLAFUZZ_SHARD", "BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT")


@pytest.fixture(autouse=True)
def _no_ci_variables(monkeypatch):
    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _run(out: Path, *shard: str) -> tuple[str, list[str]]:
    """(run.json's shard, the case ids of the findings) of 12 cases of a gather that is always wrong."""
    rc = main(
        [
            "fuzz",
            "--op",
            "gather",
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "12",
            "--seed",
            "5",
            "--shrink-budget",
            "0",
            "--out",
            str(out),
            "--quiet",
            "--in-process",
            *shard,
        ]
    )
    assert rc == 1
    lines = (out / "findings.jsonl").read_text().splitlines()
    return json.loads((out / "run.json").read_text())["shard"], sorted({json.loads(x)["case_id"] for x in lines})


def test_shard_auto_under_buildkite_or_mlafuzz_shard_runs_the_explicit_shards_cases(tmp_path, monkeypatch):
    explicit = _run(tmp_path / "explicit", "--shard", "2/3")
    assert explicit[0] == "2/3" and explicit[1]
    monkeypatch.setenv("BUILDKITE_PARALLEL_JOB", "2")
    monkeypatch.setenv("BUILDKITE_PARALLEL_JOB_COUNT", "3")
    assert _run(tmp_path / "buildkite", "--shard", "auto") == explicit
    assert _run(tmp_path / "buildkite-default") == explicit  # auto is the default
    monkeypatch.delenv("BUILDKITE_PARALLEL_JOB")
    monkeypatch.delenv("BUILDKITE_PARALLEL_JOB_COUNT")
    monkeypatch.setenv("MLAFUZZ_SHARD", "2/3")
    assert _run(tmp_path / "matrix", "--shard", "auto") == explicit
    monkeypatch.delenv("MLAFUZZ_SHARD")
    whole = _run(tmp_path / "whole")
    assert whole[0] == "0/1" and whole[1] != explicit[1]


def test_shard_variables_are_read_in_order_and_default_to_the_whole_run():
    assert shard_from_env({}) == (0, 1, "")
    assert shard_from_env({"BUILDKITE_PARALLEL_JOB": "3", "BUILDKITE_PARALLEL_JOB_COUNT": "4"}) == (
        3,
        4,
        "BUILDKITE_PARALLEL_JOB",
    )
    both = {"MLAFUZZ_SHARD": "1/2", "BUILDKITE_PARALLEL_JOB": "3", "BUILDKITE_PARALLEL_JOB_COUNT": "4"}
    assert shard_from_env(both) == (1, 2, "MLAFUZZ_SHARD")  # the user's own word wins


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"MLAFUZZ_SHARD": "4/4"}, "MLAFUZZ_SHARD='4/4'"),
        ({"BUILDKITE_PARALLEL_JOB": "1"}, "BUILDKITE_PARALLEL_JOB/BUILDKITE_PARALLEL_JOB_COUNT='1/?'"),
    ],
)
def test_a_malformed_shard_variable_is_one_line_and_exit_2(env, needle, monkeypatch, tmp_path, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["fuzz", "--device", "cpu", "--cases", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_the_pytest_plugin_reads_the_ci_jobs_shard_and_its_parts_split_it_exactly():
    from mlafuzz.harness.drive.fuzz import Shard
    from mlafuzz.harness.pytest_plugin import ci_shard

    buildkite = {"BUILDKITE_PARALLEL_JOB": "1", "BUILDKITE_PARALLEL_JOB_COUNT": "2"}
    assert ci_shard(buildkite) == (1, 2)
    assert ci_shard({"MLAFUZZ_SHARD": "1/2"}) == (1, 2)
    assert ci_shard({}) == (0, 1)
    # Copy 1 of 2 in 3 parts: its rounds (odd ones) go to the parts in turn, none left out.
    parts = [Shard(index=1, count=2).part(k, 3) for k in range(3)]
    owned = [{r for r in range(60) if p.owns(r)} for p in parts]
    assert set().union(*owned) == {r for r in range(60) if r % 2 == 1} and sum(map(len, owned)) == 30
