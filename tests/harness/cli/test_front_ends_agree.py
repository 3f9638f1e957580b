"""`mlafuzz fuzz` and the pytest plugin are two front ends of one campaign (drive/campaign.py): they
refuse the same --impl with the same words, and run the same cases for the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.campaign import Campaign, CampaignError, run_campaign

pytest_plugins = ["pytester"]

PLANTED = Path(__file__).parents[2] / "support" / "planted"
FROM_ZERO = f"{PLANTED / 'gather_from_zero.py'}:gather"  # wrong on seq_starts cases: findings to compare
CLI_PREFIX, PLUGIN_PREFIX = "mlafuzz: error: ", "mlafuzz: "


def _plugin_args() -> list[str]:
    import importlib.metadata

    installed = any(
        ep.value.startswith("mlafuzz.harness.pytest_plugin") for ep in importlib.metadata.entry_points(group="pytest11")
    )
    quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    return quiet if installed else ["-p", "mlafuzz.harness.pytest_plugin", *quiet]


def _cli_refusal(impl: str, tmp_path: Path, capsys) -> str:
    rc = main(["fuzz", "--impl", impl, "--device", "cpu", "--cases", "1", "--out", str(tmp_path / "cli")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(CLI_PREFIX), err
    return err[len(CLI_PREFIX) :]


def _plugin_refusal(impl: str, pytester) -> str:
    result = pytester.runpytest(
        *_plugin_args(), "--mlafuzz-cases", "1", "--mlafuzz-device", "cpu", "--mlafuzz-impl", impl
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = next(x for x in result.stderr.lines if PLUGIN_PREFIX in x)
    return line[line.index(PLUGIN_PREFIX) + len(PLUGIN_PREFIX) :]


@pytest.mark.parametrize(
    "impl",
    [
        "gather=nosuchimpl",  # no such registered name
        f"gather={PLANTED / 'wrong_signature.py'}:gather",  # loads, but cannot take the op's call
        f"gather={PLANTED / 'not_callable.py'}:gather",
    ],
)
def test_fuzz_and_the_plugin_refuse_a_bad_impl_with_the_same_line_before_any_case(impl, pytester, tmp_path, capsys):
    cli = _cli_refusal(impl, tmp_path, capsys)
    assert _plugin_refusal(impl, pytester) == cli
    assert not (tmp_path / "cli" / "findings.jsonl").exists()  # refused before the run folder was touched


def _findings(folder: Path) -> list[tuple[str, str]]:
    lines = (folder / "findings.jsonl").read_text().splitlines()
    return sorted((d["case_id"], d["kind"]) for d in map(json.loads, lines))


def test_fuzz_and_the_plugin_run_the_same_cases_for_the_same_seed(pytester, tmp_path, monkeypatch):
    for var in ("MLAFUZZ_SHARD", "BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT"):
        monkeypatch.delenv(var, raising=False)
    common = ["--device", "cpu", "--cases", "8", "--seed", "7", "--shrink-budget", "0"]
    cli_out = tmp_path / "cli"
    rc = main(["fuzz", "--impl", f"gather={FROM_ZERO}", "--in-process", "--out", str(cli_out), *common])
    assert rc == 1  # the planted gather is wrong on some of these cases
    plugin = [f"--mlafuzz-{a[2:]}" if a.startswith("--") else a for a in common]
    result = pytester.runpytest(
        *_plugin_args(), *plugin, "--mlafuzz-impl", f"gather={FROM_ZERO}", "--mlafuzz-out", "out"
    )
    result.assert_outcomes(failed=1)
    [item_dir] = (pytester.path / "out").iterdir()
    cli_run = json.loads((cli_out / "run.json").read_text())
    plugin_run = json.loads((item_dir / "run.json").read_text())
    assert plugin_run == cli_run  # the same campaign: ops, impls, seed, shard, knobs, cases, revision...
    assert _findings(item_dir) == _findings(cli_out) != []


def test_a_campaign_refuses_gpu_memory_checks_on_the_cpu_in_one_line(tmp_path):
    campaign = Campaign(ops=("gather",), device="cpu", cases=1, out_dir=tmp_path, redzone=True)
    with pytest.raises(CampaignError, match="^--redzone and --sanitizer check GPU memory") as info:
        run_campaign(campaign)
    assert len(str(info.value).splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing ran, nothing was written
