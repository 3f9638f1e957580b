"""findings.jsonl: a torn last line (a run killed mid-write) is forgiven, a bad line anywhere else is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.reports.findings import Finding, Kind
from mlafuzz.reports.jsonl import JsonlError, JsonlSink, read_findings, read_jsonl


def _finding(case_id: str) -> Finding:
    return Finding(kind=Kind.VALUE_MISMATCH, op="gather", impl="torch", case_id=case_id, message="m", cause="dst:value")


def _run(path: Path, *case_ids: str) -> Path:
    path.mkdir(parents=True)
    with JsonlSink(path / "findings.jsonl") as sink:
        sink.write_findings([_finding(c) for c in case_ids])
    return path


def test_a_run_killed_mid_write_reads_every_whole_line(tmp_path):
    run = _run(tmp_path / "run", "a", "b")
    with (run / "findings.jsonl").open("a") as fh:
        fh.write('{"kind": "VALUE_MIS')  # the kill cut this write short
    assert [f.case_id for f in read_findings(run / "findings.jsonl")] == ["a", "b"]


@pytest.mark.parametrize("bad", ['{"kind": "VALUE_MIS', "[1, 2]", "\x00\x00\x00"])
def test_a_bad_line_in_the_middle_names_the_file_and_line(tmp_path, bad):
    run = _run(tmp_path / "run", "a")
    with (run / "findings.jsonl").open("a") as fh:
        fh.write(bad + "\n" + json.dumps(_finding("c").to_json()) + "\n")
    with pytest.raises(JsonlError, match=r"findings\.jsonl:2: .*corrupt"):
        list(read_jsonl(run / "findings.jsonl"))


def test_report_and_merge_refuse_a_corrupt_findings_file_in_one_line(tmp_path, capsys):
    run = _run(tmp_path / "run", "a", "b")
    lines = (run / "findings.jsonl").read_text().splitlines()
    (run / "findings.jsonl").write_text("\n".join([lines[0], "garbage", lines[1]]) + "\n")
    assert main(["report", str(run), "--format", "json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "findings.jsonl:2: not valid JSON" in err and "\n" not in err
    assert main(["merge", str(run), "--out", str(tmp_path / "merged")]) == 2
    assert "findings.jsonl:2:" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()  # nothing written from a corrupt input


@pytest.mark.parametrize("tail, kept", [('{"kind": "VALUE_MIS', ["a", "c"]), (None, ["a", "b", "c"])])
def test_appending_after_a_torn_tail_keeps_the_file_readable(tmp_path, tail, kept):
    # --resume appends to the findings of a killed run: a torn fragment must not end up mid-file,
    # and a whole record whose newline the kill cut off must not be lost.
    run = _run(tmp_path / "run", "a")
    with (run / "findings.jsonl").open("a") as fh:
        fh.write(tail if tail is not None else json.dumps(_finding("b").to_json()))
    with JsonlSink(run / "findings.jsonl") as sink:
        sink.write_findings([_finding("c")])
    assert [f.case_id for f in read_findings(run / "findings.jsonl")] == kept
