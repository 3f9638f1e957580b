"""One bug, one bucket: the same rows wrong in convert's ``out`` and ``valid_counts`` are one
finding naming both facts, while a bug in one of them alone keeps its own bucket."""

from __future__ import annotations

from pathlib import Path

from mlafuzz.harness.check.linked import fold_linked
from mlafuzz.harness.cli.main import main
from mlafuzz.reports.findings import Finding, Kind, Mismatch, Severity
from mlafuzz.reports.jsonl import read_findings


def _fuzz(impl: str, out: Path) -> list[Finding]:
    """The errors of a 30-case CPU run of ``impl`` (each bucket bundled as found)."""
    argv = ["fuzz", "--op", "convert", "--impl", f"convert={impl}", "--device", "cpu", "--cases", "30"]
    main([*argv, "--seed", "0", "--out", str(out), "--shrink-budget", "0", "--quiet", "--in-process"])
    return [f for f in read_findings(out / "findings.jsonl") if f.severity is Severity.ERROR]


def test_a_convert_off_by_one_on_the_last_block_gives_one_bucket_naming_both_outputs(tmp_path):
    found = _fuzz("convert_block_edge", tmp_path)
    assert found
    assert {f.dedup_key for f in found} == {
        ("VALUE_MISMATCH", "convert", "convert_block_edge", "out:value+valid_counts:value")
    }
    f = found[0]
    assert "out: Mismatched elements" in f.message and "the same rows in valid_counts:" in f.message
    assert [g["tensor"] for g in f.extra["linked"]] == ["valid_counts"]
    assert len(list((tmp_path / "bundles").iterdir())) == 1


def test_a_count_bug_alone_keeps_its_own_bucket(tmp_path):
    found = _fuzz("convert_count_all", tmp_path)
    assert found and {f.cause for f in found} == {"valid_counts:value"}


def _value(tensor: str, row: int) -> Finding:
    return Finding(
        kind=Kind.VALUE_MISMATCH,
        op="convert",
        impl="x",
        case_id="c",
        message=f"{tensor}: wrong",
        cause=f"{tensor}:value",
        tensor=tensor,
        mismatches=(Mismatch(index=(row, 0) if tensor == "out" else (row,), expected="1", actual="2"),),
        count=1,
    )


def test_findings_of_different_first_rows_are_different_causes_and_stay_apart():
    apart = [_value("out", 0), _value("valid_counts", 3)]
    assert fold_linked(("out", "valid_counts"), apart) == apart
    (one,) = fold_linked(("out", "valid_counts"), [_value("valid_counts", 2), _value("out", 2)])
    assert one.cause == "out:value+valid_counts:value" and one.tensor == "out"
