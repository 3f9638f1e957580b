"""One bug, one bucket: the same rows wrong in convert's ``out`` and ``valid_counts`` are one
finding naming both facts, while a bug in one of them alone keeps its own bucket."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mlafuzz.harness.check.linked import fold_linked
from mlafuzz.harness.cli.main import main
from mlafuzz.reports.findings import Finding, Kind, Mismatch, Severity
from mlafuzz.reports.jsonl import read_findings


def _fuzz(impl: str, out: Path, *revision: str) -> list[Finding]:
    """The errors of a 30-case CPU run of ``impl`` (each bucket bundled as found); ``revision``:
    ``--revision NAME`` (none: the default)."""
    argv = ["fuzz", "--op", "convert", "--impl", f"convert={impl}", "--device", "cpu", "--cases", "30"]
    main([*argv, "--seed", "0", "--out", str(out), "--shrink-budget", "0", "--quiet", "--in-process", *revision])
    return [f for f in read_findings(out / "findings.jsonl") if f.severity is Severity.ERROR]


# Under the default (2026-11) a counted row is compacted and compared as a multiset with a -1 tail
# (out:row_set); before it, element by element (out:value). Either way the same rows' wrong count
# is the same bug: one bucket naming both outputs.
@pytest.mark.parametrize(
    "revision, cause, out_words",
    [
        ((), "out:row_set+valid_counts:value", "out: Mismatched rows"),
        (("--revision", "2026-10"), "out:value+valid_counts:value", "out: Mismatched elements"),
    ],
    ids=["default", "2026-10"],
)
def test_a_convert_off_by_one_on_the_last_block_gives_one_bucket_naming_both_outputs(
    revision, cause, out_words, tmp_path
):
    found = _fuzz("convert_block_edge", tmp_path, *revision)
    assert found
    assert {f.dedup_key for f in found} == {("VALUE_MISMATCH", "convert", "convert_block_edge", cause)}
    f = found[0]
    assert out_words in f.message and "the same rows in valid_counts:" in f.message
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
    row_set = dataclasses.replace(_value("out", 2), cause="out:row_set")  # a counted row, 2026-11
    (one,) = fold_linked(("out", "valid_counts"), [_value("valid_counts", 2), row_set])
    assert one.cause == "out:row_set+valid_counts:value" and one.tensor == "out"
