"""The expected-failures ledger: matching, split, stale entries, and one-line errors for malformed files."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mlafuzz.harness.ledger import LedgerError, judge, load_ledger
from mlafuzz.reports.console import stale_lines, verdict_lines
from mlafuzz.reports.findings import Finding, Kind, Severity
from mlafuzz.reports.jsonl import JsonlSink
from mlafuzz.tests.support.helpers import render_dir

ISSUE = "https://github.com/vllm-project/vllm/pull/48642"


def _finding(kind=Kind.VALUE_MISMATCH, op="gather", impl="vllm", cause="dst:value") -> Finding:
    return Finding(kind=kind, op=op, impl=impl, case_id=f"{kind.value}-{cause}", message="m", cause=cause)


def _toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "ledger.toml"
    path.write_text(body)
    return path


ENTRY = '[[expected]]\nkind = "VALUE_MISMATCH"\nop = "gather"\nimpl = "vllm"\ncause = "{cause}"\nissue = "{issue}"\n'


def test_wildcard_cause_waives_every_cause_of_its_bucket_and_nothing_else(tmp_path):
    ledger = load_ledger(_toml(tmp_path, ENTRY.format(cause="*", issue=ISSUE)))
    waived = [_finding(cause="dst:value"), _finding(cause="dst:rope")]
    other = [_finding(kind=Kind.NAN_MISMATCH), _finding(impl="cuda"), _finding(op="convert")]
    judgement = judge(waived + other, ledger=ledger)
    assert [judgement.statuses[f.dedup_key] for f in waived] == ["expected"] * 2
    assert [judgement.statuses[f.dedup_key] for f in other] == ["failure"] * 3


def test_exact_cause_entry_wins_over_a_wildcard_one(tmp_path):
    body = ENTRY.format(cause="*", issue="https://a") + ENTRY.format(cause="dst:value", issue="https://b")
    ledger = load_ledger(_toml(tmp_path, body))
    assert ledger.match(_finding(cause="dst:value")).issue == "https://b"
    assert ledger.match(_finding(cause="dst:nope")).issue == "https://a"


def test_a_waived_bucket_reports_the_ledger_entry_itself_with_its_file(tmp_path):
    # One record: what the ledger loads is what judge hands the reports, file name included.
    path = _toml(tmp_path, ENTRY.format(cause="*", issue=ISSUE))
    ledger = load_ledger(path)
    (entry,) = ledger.entries
    judgement = judge([_finding()], ledger=ledger)
    assert judgement.waivers[_finding().dedup_key] is entry
    assert entry.ledger == str(path) and entry.label() == "expected[0] VALUE_MISMATCH gather=vllm cause=*"


def test_stale_lists_entries_that_matched_nothing_among_what_ran(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(
        json.dumps(
            {
                "expected": [
                    {"kind": "VALUE_MISMATCH", "op": "gather", "impl": "vllm", "cause": "*", "issue": ISSUE},
                    {"kind": "OOB_WRITE", "op": "gather", "impl": "vllm", "cause": "*", "link": "https://x/1"},
                    {"kind": "OOB_WRITE", "op": "convert", "impl": "vllm", "cause": "*", "issue": "https://x/2"},
                ]
            }
        )
    )
    ledger = load_ledger(path)
    stale = ledger.stale([_finding()])
    assert [e.index for e in stale] == [1, 2]
    assert [e.index for e in ledger.stale([_finding()], ran={("gather", "vllm")})] == [1]  # convert didn't run
    (line,) = stale_lines(stale[:1])
    assert "expected[1] OOB_WRITE gather=vllm" in line and "https://x/1" in line


@pytest.mark.parametrize(
    "body, needle",
    [
        (ENTRY.format(cause="*", issue="").replace('issue = ""\n', ""), "expected[0] (kind='VALUE_MISMATCH'"),
        (ENTRY.format(cause="*", issue="").replace('issue = ""\n', ""), "issue= (or link=) is required"),
        (ENTRY.format(cause="*", issue=" "), "issue=' ' must be a non-empty string"),
        (ENTRY.format(cause="*", issue=ISSUE).replace("VALUE_MISMATCH", "VALUE"), "kind='VALUE' is not a finding kind"),
        (ENTRY.format(cause="*", issue=ISSUE).replace('impl = "vllm"', 'impl = "*"'), "only cause may be '*'"),
        (ENTRY.format(cause="*", issue=ISSUE).replace('cause = "*"\n', ""), "cause= is required"),
        (ENTRY.format(cause="*", issue=ISSUE) + 'isue = "x"\n', "unknown key 'isue'"),
        (
            ENTRY.format(cause="*", issue=ISSUE) * 2,
            "expected[1] VALUE_MISMATCH gather=vllm cause=* duplicates expected[0]",
        ),
        ('[[expected]\nkind = "x"\n', "not valid TOML"),
        ('expected = "nope"\n', "top-level 'expected' array"),
        ("waivers = []\n", "unknown top-level key 'waivers'"),
        ("expected = [1]\n", "expected[0] must be a table/object, got int"),
    ],
)
def test_malformed_ledger_is_one_line_naming_the_file_and_entry(tmp_path, body, needle):
    path = _toml(tmp_path, body)
    with pytest.raises(LedgerError) as info:
        load_ledger(path)
    message = str(info.value)
    assert needle in message and f"ledger={path}" in message and "\n" not in message
    assert isinstance(info.value, ValueError)


def test_missing_ledger_file_and_bad_json_are_one_line(tmp_path):
    with pytest.raises(LedgerError, match=r"ledger=.*nope.toml: no such file"):
        load_ledger(tmp_path / "nope.toml")
    bad = tmp_path / "l.json"
    bad.write_text('{"expected": [')
    with pytest.raises(LedgerError, match="not valid JSON"):
        load_ledger(bad)


def test_reports_show_waived_buckets_as_expected_not_failed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with JsonlSink(run / "findings.jsonl") as sink:
        sink.write_findings([_finding(), _finding(kind=Kind.OOB_WRITE, cause="guard:after")])
    ledger = load_ledger(_toml(tmp_path, ENTRY.format(cause="*", issue=ISSUE)))
    root = ET.fromstring(render_dir(run, "junit", ledger=ledger))
    assert root.get("failures") == "1" and root.find(".//failure").get("type") == "OOB_WRITE"
    assert ISSUE in root.find(".//system-out").text
    doc = json.loads(render_dir(run, "json", ledger=ledger))
    assert doc["counts"]["expected_buckets"] == 1 and doc["stale_ledger_entries"] == []
    assert f'<a href="{ISSUE}">' in render_dir(run, "html", ledger=ledger)  # http(s) issues become links
    sneaky = load_ledger(_toml(tmp_path, ENTRY.format(cause="*", issue="javascript:alert(1)")))
    assert "href" not in render_dir(run, "html", ledger=sneaky).split("Details")[-1]  # other schemes stay text


def test_verdict_fails_only_on_unexpected_errors_and_lists_stale_entries(tmp_path):
    ledger = load_ledger(
        _toml(
            tmp_path,
            ENTRY.format(cause="*", issue=ISSUE)
            + ENTRY.format(cause="*", issue=ISSUE).replace("VALUE_MISMATCH", "OOB_WRITE"),
        )
    )
    info = Finding(kind=Kind.EXCEPTION, op="gather", impl="vllm", case_id="c", message="m", severity=Severity.INFO)
    found = [_finding(), info]
    verdict = judge(found, ledger=ledger, ran=[("gather", "vllm")])
    assert verdict.passed and [e.kind for e in verdict.stale] == ["OOB_WRITE"]
    head, stale_line = verdict_lines(verdict, found)
    assert "1 expected finding, 0 unexpected" in head and "stale ledger entry expected[1]" in stale_line
    assert not judge([_finding(impl="cuda")], ledger=ledger).passed


def _fuzz_has_ledger_option() -> bool:
    from mlafuzz.harness.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "fuzz" in a.choices)
    return any("--ledger" in a.option_strings for a in sub.choices["fuzz"]._actions)


@pytest.mark.skipif(not _fuzz_has_ledger_option(), reason="fuzz --ledger not wired into harness/cli.py yet")
def test_fuzz_exits_0_when_every_finding_is_expected_and_names_stale_entries(tmp_path, capsys):
    from mlafuzz.harness.cli.main import main

    planted = f"{Path(__file__).parents[2] / 'support' / 'planted' / 'gather_from_zero.py'}:gather"
    body = "".join(
        f'[[expected]]\nkind = "{k}"\nop = "gather"\nimpl = "{planted}"\ncause = "*"\nissue = "https://x/{i}"\n'
        for i, k in enumerate(("VALUE_MISMATCH", "NAN_MISMATCH", "OOB_WRITE"))
    )
    argv = [
        "fuzz",
        "--impl",
        f"gather={planted}",
        "--device",
        "cpu",
        "--cases",
        "4",
        "--seed",
        "7",
        "--in-process",
        "--shrink-budget",
        "0",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--ledger",
        str(_toml(tmp_path, body)),
    ]
    assert main(argv) == 0
    assert "stale ledger entry expected[2] OOB_WRITE" in capsys.readouterr().err
    assert main(argv[:-2] + ["--overwrite"]) == 1  # without the ledger the same findings fail
