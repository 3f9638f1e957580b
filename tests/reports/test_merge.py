"""Merging shard run directories, and the `report`/`merge` subcommands that front it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mlafuzz.harness.cli.args import Parser, UsageError
from mlafuzz.harness.cli.main import main
from mlafuzz.harness.cli.report_cmd import add_parsers
from mlafuzz.reports.invocation import command
from mlafuzz.reports.jsonl import read_findings, read_jsonl
from mlafuzz.reports.merge import merge_runs
from mlafuzz.reports.model import ReportError, replay_command
from mlafuzz.tests.support.helpers import render_dir, report_of

PLANTED = Path(__file__).parents[1] / "support" / "planted" / "gather_from_zero.py"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    """Two shards (0/2, 1/2) of the same planted-gather run, no bundles."""
    root = tmp_path_factory.mktemp("shards")
    dirs = []
    for k in (0, 1):
        out = root / f"shard{k}"
        rc = main(
            [
                "fuzz",
                "--op",
                "gather",
                "--impl",
                f"gather={PLANTED}:gather",
                "--device",
                "cpu",
                "--cases",
                "12",
                "--shard",
                f"{k}/2",
                "--out",
                str(out),
                "--quiet",
                "--in-process",
                "--shrink-budget",
                "0",
            ]
        )
        assert rc == 1
        # The run.json a shard will carry: its seed and shard make each finding re-runnable.
        (out / "run.json").write_text(
            json.dumps(
                {
                    "ops": ["gather"],
                    "impls": {"gather": f"{PLANTED}:gather"},
                    "device": "cpu",
                    "seed": 0,
                    "shard": f"{k}/2",
                    "cases": 12,
                }
            )
        )
        dirs.append(out)
    return dirs


def _cli(argv: list[str]) -> int:
    parser = Parser(prog="mlafuzz")
    add_parsers(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    args = parser.parse_args(argv)
    return args.func(args)


def test_merge_of_two_shards_sums_counts_and_concatenates_findings(shards, tmp_path):
    result = merge_runs(shards, tmp_path / "merged")
    parts = [json.loads((d / "summary.json").read_text()) for d in shards]
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    for key in ("cases", "skipped", "findings", "infos"):
        assert merged[key] == sum(p[key] for p in parts)
    assert merged["per_op"]["gather"] == sum(p["per_op"]["gather"] for p in parts) == 24
    for kind in set(parts[0]["by_kind"]) | set(parts[1]["by_kind"]):
        assert merged["by_kind"][kind] == sum(p["by_kind"].get(kind, 0) for p in parts)
    for feat, n in merged["coverage"].items():
        assert n == sum(p["coverage"].get(feat, 0) for p in parts)
    lines = [len(list(read_jsonl(d / "findings.jsonl"))) for d in shards]
    assert result.findings_lines == sum(lines) == len(read_findings(tmp_path / "merged" / "findings.jsonl"))
    assert merged["buckets"] == len({f.dedup_key for d in shards for f in read_findings(d / "findings.jsonl")})
    assert [s["shard"] for s in merged["shards"]] == ["0/2", "1/2"]


def test_merged_findings_keep_their_shard_and_replay_from_it(shards, tmp_path):
    merge_runs(shards, tmp_path / "merged")
    findings = read_findings(tmp_path / "merged" / "findings.jsonl")
    origins = [f.extra["shard"] for f in findings]
    assert {o["dir"] for o in origins} == {str(d) for d in shards}
    first_of_shard1 = next(f for f in findings if f.extra["shard"]["index"] == 1)
    run = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert "shard" not in run and run["seed"] == 0 and run["merged_from"] == [str(d) for d in shards]
    assert "--shard 1/2" in replay_command(first_of_shard1, run)


def test_a_merged_run_renders_like_any_run(shards, tmp_path):
    merge_runs(shards, tmp_path / "merged")
    root = ET.fromstring(render_dir(tmp_path / "merged", "junit"))
    report = report_of(tmp_path / "merged")
    assert root.get("failures") == str(len(report.failures)) and root.get("tests") == "1"
    assert "Shards" in render_dir(tmp_path / "merged", "html")


@pytest.mark.parametrize(
    "case, needle",
    [
        ("out_is_input", "is one of the inputs"),
        ("twice", "is given twice"),
        ("not_a_run", "not a run directory"),
        ("none", "at least one"),
    ],
)
def test_merge_refuses_bad_inputs_with_one_line(shards, tmp_path, case, needle):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = {
        "out_is_input": (shards, shards[0]),
        "twice": ([shards[0], shards[0]], tmp_path / "m"),
        "not_a_run": ([empty], tmp_path / "m"),
        "none": ([], tmp_path / "m"),
    }[case]
    with pytest.raises(ReportError, match=needle) as info:
        merge_runs(*args)
    assert "\n" not in str(info.value)


def test_report_and_merge_subcommands_write_files_and_fail_in_one_line(shards, tmp_path, capsys):
    assert _cli(["merge", *map(str, shards), "--out", str(tmp_path / "m")]) == 0
    assert "merged 2 run directories" in capsys.readouterr().out
    out = tmp_path / "r" / "junit.xml"
    with pytest.raises(UsageError, match="folder .* does not exist"):  # a mistyped path is never created
        _cli(["report", str(tmp_path / "m"), "--format", "junit", "-o", str(out)])
    assert not out.parent.exists()
    out.parent.mkdir()
    assert _cli(["report", str(tmp_path / "m"), "--format", "junit", "-o", str(out)]) == 1  # written; it failed
    assert ET.parse(out).getroot().get("tests") == "1"
    assert _cli(["report", str(shards[0]), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "failed"
    with pytest.raises(UsageError, match="no such directory"):
        _cli(["report", str(tmp_path / "nope")])
    with pytest.raises(UsageError, match="invalid choice"):
        _cli(["report", str(shards[0]), "--format", "pdf"])


def test_shards_without_run_json_are_attributed_by_their_findings_never_by_guesswork(shards, tmp_path):
    import shutil

    planted = tmp_path / "planted"
    shutil.copytree(shards[0], planted)
    (planted / "run.json").unlink()
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "summary.json").write_text(json.dumps({"cases": 5, "per_op": {"gather": 5}, "findings": 0}))
    (clean / "findings.jsonl").write_text("")
    merge_runs([planted, clean], tmp_path / "m")
    merged = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert [s["shard"] for s in merged["shards"]] == [None, None]
    assert not (tmp_path / "m" / "run.json").exists()
    cases = {(t.impl, t.cases) for t in report_of(tmp_path / "m").testcases}
    assert cases == {(f"{PLANTED}:gather", 12), ("?", 5)}


def _fake_run(
    path: Path,
    *,
    seed: int,
    shard: str,
    cases: int = 16,
    impl: str = "torch",
    lines: int = 2,
    total: int = 5,
    ledger: dict | None = None,
    stopped: bool = False,
) -> Path:
    """A run directory as fuzz writes it: one bucket of ``total`` findings, ``lines`` of them kept;
    ``ledger``: the ledger record its run.json keeps; ``stopped``: a SIGTERM ended it."""
    from mlafuzz.reports.findings import Finding, Kind
    from mlafuzz.reports.jsonl import JsonlSink

    path.mkdir(parents=True)
    f = Finding(kind=Kind.VALUE_MISMATCH, op="gather", impl=impl, case_id="c", message="m", cause="dst:value")
    with JsonlSink(path / "findings.jsonl") as sink:
        sink.write_findings([f] * lines)
    (path / "summary.json").write_text(
        json.dumps(
            {
                "cases": cases,
                "skipped": 0,
                "findings": total,
                "infos": 0,
                "per_op": {"gather": cases},
                "by_kind": {"VALUE_MISMATCH": total},
                "bucket_counts": {"\x1f".join(f.dedup_key): total},
                "interrupted": stopped,
                "terminated": stopped,
            }
        )
    )
    (path / "run.json").write_text(
        json.dumps(
            {
                "ops": ["gather"],
                "impls": {"gather": impl},
                "device": "cpu",
                "seed": seed,
                "shard": shard,
                "cases": cases,
                "ledger": ledger,
            }
        )
    )
    return path


@pytest.mark.parametrize(
    "second, needle",
    [
        ({"seed": 8, "shard": "1/2"}, "different seeds"),
        ({"seed": 7, "shard": "1/4"}, "different shard schemes"),
    ],
)
def test_merge_refuses_runs_that_are_not_shards_of_one_run(second, needle, tmp_path):
    a = _fake_run(tmp_path / "a", seed=7, shard="0/2")
    b = _fake_run(tmp_path / "b", **second)
    with pytest.raises(ReportError, match=needle) as info:
        merge_runs([a, b], tmp_path / "m")
    assert "\n" not in str(info.value) and not (tmp_path / "m").exists()


def test_merge_drops_a_directory_that_repeats_anothers_cases_and_says_so(tmp_path, capsys):
    a = _fake_run(tmp_path / "a", seed=7, shard="0/1")
    copy = _fake_run(tmp_path / "copy", seed=7, shard="0/1")
    b = _fake_run(tmp_path / "b", seed=7, shard="1/2")
    a2 = _fake_run(tmp_path / "a2", seed=7, shard="0/2")
    result = merge_runs([a2, b, _fake_run(tmp_path / "b-again", seed=7, shard="1/2")], tmp_path / "m")
    assert [(d.dir, d.kept) for d in result.dropped] == [(tmp_path / "b-again", b)]
    assert result.summary["cases"] == 32 and result.shards == 2  # 16 + 16, not 48
    assert _cli(["merge", str(a), str(copy), "--out", str(tmp_path / "m2")]) == 0
    out = capsys.readouterr().out
    assert f"dropped {copy}: it repeats the cases of {a}" in out and "merged 1 run directory" in out
    assert json.loads((tmp_path / "m2" / "summary.json").read_text())["cases"] == 16


def test_merge_sums_bucket_counts_so_reports_count_every_finding(tmp_path):
    a = _fake_run(tmp_path / "a", seed=7, shard="0/2", total=120)
    b = _fake_run(tmp_path / "b", seed=7, shard="1/2", total=62)
    merged = merge_runs([a, b], tmp_path / "m").summary
    assert list(merged["bucket_counts"].values()) == [182] and merged["findings"] == 182
    assert report_of(tmp_path / "m").headline().startswith("mlafuzz: 1 failing bucket (182 findings)")


def test_merge_refuses_shards_of_different_implementations_in_one_line(tmp_path, capsys):
    a = _fake_run(tmp_path / "a", seed=7, shard="0/2")
    other = _fake_run(tmp_path / "other", seed=7, shard="1/2", impl="gather_no_seq_starts")
    assert main(["merge", str(a), str(other), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "different implementations of gather" in err
    assert not (tmp_path / "m").exists()


def test_merge_refuses_a_used_out_folder_as_fuzz_does_unless_overwrite(tmp_path, capsys):
    a = _fake_run(tmp_path / "a", seed=7, shard="0/1")
    assert main(["merge", str(a), "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["merge", str(a), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--out {tmp_path / 'm'} holds an earlier run (its findings would mix with this one's)" in err
    assert "--overwrite" in err
    (tmp_path / "m" / "bundles" / "old").mkdir(parents=True)
    (tmp_path / "m" / "bundles" / "old" / "case.json").write_text("{}")
    assert main(["merge", str(a), "--out", str(tmp_path / "m"), "--overwrite"]) == 0
    assert not (tmp_path / "m" / "bundles" / "old").exists()  # the earlier run's bundles went with it


def test_merge_carries_the_shards_bundles_and_its_reports_point_at_them(tmp_path, capsys, monkeypatch):
    import os
    import shutil
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    for k in (0, 1):
        args = ["fuzz", "--op", "gather", "--impl", f"gather={PLANTED}:gather", "--device", "cpu", "--cases", "12"]
        args += ["--seed", "0", "--shard", f"{k}/2", "--out", f"shard-{k}", "--in-process", "--shrink-budget", "2"]
        assert main(args) == 1
    assert main(["merge", "shard-0", "shard-1", "--out", "merged"]) == 0
    assert "repro bundle in merged/bundles" in capsys.readouterr().out
    (bundle,) = (tmp_path / "merged" / "bundles").iterdir()  # one bucket: one bundle, the first shard's
    for k in (0, 1):
        shutil.rmtree(tmp_path / f"shard-{k}")  # the artifact is the merged folder alone
    line = (bundle / "replay.txt").read_text().strip()
    assert line.startswith(command("replay", f"merged/bundles/{bundle.name}", "--impl", "gather="))
    assert json.loads((bundle / "finding.json").read_text())["repro"] == line
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert [b["path"] for b in summary["bundles"]] == [f"merged/bundles/{bundle.name}"]
    assert line in render_dir(tmp_path / "merged", "md")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    replayed = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=300)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr


def _ledger_record(impl: str = "torch", kind: str = "VALUE_MISMATCH") -> dict:
    entry = {"kind": kind, "op": "gather", "impl": impl, "cause": "*", "issue": "https://x/1", "note": ""}
    return {"file": "mlafuzz-ledger.toml", "expected": [entry]}


def test_merge_refuses_shards_judged_by_different_ledgers_in_one_line(tmp_path, capsys):
    a = _fake_run(tmp_path / "a", seed=7, shard="0/2", ledger=_ledger_record())
    b = _fake_run(tmp_path / "b", seed=7, shard="1/2")
    assert main(["merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "different ledgers" in err and "no ledger" in err
    assert not (tmp_path / "m").exists()


def test_report_of_a_merge_applies_the_ledger_its_shards_recorded_unless_told_another(tmp_path, capsys):
    record = _ledger_record()
    shards = [_fake_run(tmp_path / f"out-{k}", seed=7, shard=f"{k}/2", ledger=record) for k in (0, 1)]
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "m")]) == 0
    assert json.loads((tmp_path / "m" / "run.json").read_text())["ledger"] == record
    capsys.readouterr()
    assert main(["report", str(tmp_path / "m"), "--format", "json"]) == 0  # the one bucket is ledgered
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "passed" and doc["counts"]["expected_buckets"] == 1 and doc["failures"] == 0
    assert "ledger `mlafuzz-ledger.toml`" in render_dir(tmp_path / "m", "md")  # which ledger judged it
    other = tmp_path / "other.toml"
    other.write_text('[[expected]]\nkind = "NAN_MISMATCH"\nop = "gather"\nimpl = "torch"\ncause = "*"\nissue = "x"\n')
    assert main(["report", str(tmp_path / "m"), "--format", "json", "--ledger", str(other)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "failed" and doc["ledger"] == str(other)
    assert [e["kind"] for e in doc["stale_ledger_entries"]] == ["NAN_MISMATCH"]


def test_a_merge_missing_a_shard_warns_is_partial_and_its_report_says_incomplete_and_exits_1(tmp_path, capsys):
    shards = [_fake_run(tmp_path / f"out-{k}", seed=7, shard=f"{k}/3", ledger=_ledger_record()) for k in (0, 2)]
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "m")]) == 0  # written: report gives the verdict
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mlafuzz: merge: warning: partial: shard 1/3 of the run's 3 missing; the merged counts are not the whole"
        " run's (its report says incomplete)"
    ]
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["partial"] is True and summary["missing_shards"] == ["1/3"]
    assert main(["report", str(tmp_path / "m"), "--format", "md"]) == 1
    headline = capsys.readouterr().out.splitlines()[0]
    assert "incomplete run (shard 1/3 missing from the merge)" in headline and "passed" not in headline
    everything = [*shards, _fake_run(tmp_path / "out-1", seed=7, shard="1/3", ledger=_ledger_record())]
    assert merge_runs(everything, tmp_path / "whole").partial is False
    assert main(["report", str(tmp_path / "whole"), "--format", "md"]) == 0


def test_a_stopped_run_and_a_merge_of_it_report_stopped_never_passed(tmp_path, capsys):
    run = _fake_run(tmp_path / "run", seed=7, shard="0/1", ledger=_ledger_record(), stopped=True)
    assert main(["report", str(run), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "stopped" and doc["incomplete"] == "stopped by SIGTERM after 16 cases"
    assert doc["headline"].startswith("mlafuzz: stopped run (stopped by SIGTERM after 16 cases)")
    assert '<div class="verdict stopped">' in render_dir(run, "html")
    merged = merge_runs([run], tmp_path / "m")
    assert merged.summary["interrupted"] is True
    assert report_of(tmp_path / "m").status == "stopped"


def test_a_ledger_entry_for_an_implementation_the_run_did_not_fuzz_is_listed_as_not_applicable(tmp_path, capsys):
    record = {
        "file": "mlafuzz-ledger.toml",
        "expected": [_ledger_record()["expected"][0], _ledger_record(impl="vllm")["expected"][0]],
    }
    run = _fake_run(tmp_path / "run", seed=7, shard="0/1", ledger=record)
    assert main(["report", str(run), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "### Ledger entries not applicable to this run" in md
    assert "- expected\\[1\\] VALUE\\_MISMATCH gather=vllm cause=\\*: https://x/1" in md
    assert "Stale ledger entries" not in md  # it could not have matched: not stale
    junit = ET.fromstring(render_dir(run, "junit"))
    assert "not applicable to this run" in junit.find(".//system-err").text
