"""Reports from a real run: JUnit, Markdown, JSON and HTML agree with findings.jsonl and each other."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.reports.console import findings_table
from mlafuzz.reports.findings import Finding, Kind, Mismatch, Severity
from mlafuzz.reports.formats.render import FORMATS
from mlafuzz.reports.invocation import command
from mlafuzz.reports.jsonl import JsonlSink, read_findings
from mlafuzz.reports.model import Judgement, ReportError
from mlafuzz.tests.support.helpers import render_dir, report_of

PLANTED = Path(__file__).parents[1] / "support" / "planted" / "gather_two_bugs.py"
VOID = {"meta", "br", "wbr", "hr", "img", "input", "link"}


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory) -> Path:
    """A real fuzz run of the planted gather with two bugs (seq_starts ignored, NaN to 0): two buckets.

    No shrinking (its time varies too much for a unit test; the pytest-plugin test covers bundles end to end).
    """
    out = tmp_path_factory.mktemp("run")
    # Seed 3: its 8 cases trip both the VALUE_MISMATCH and the NAN_MISMATCH bucket.
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
            "8",
            "--seed",
            "3",
            "--out",
            str(out),
            "--quiet",
            "--in-process",
            "--shrink-budget",
            "0",
        ]
    )
    assert rc == 1
    if not (out / "run.json").exists():  # what the run records of its config, until fuzz writes it itself
        (out / "run.json").write_text(
            json.dumps(
                {"ops": ["gather"], "impls": {"gather": f"{PLANTED}:gather"}, "device": "cpu", "seed": 3, "cases": 8}
            )
        )
    return out


def _buckets_in_jsonl(run: Path, severity: str = "error") -> set[tuple]:
    return {f.dedup_key for f in read_findings(run / "findings.jsonl") if f.severity.value == severity}


def _write_run(path: Path, findings: list[Finding], summary: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with JsonlSink(path / "findings.jsonl") as sink:
        sink.write_findings(findings)
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


class _StrictHTML(HTMLParser):
    """Checks every end tag closes the innermost open element; collects ids and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.ids.update(v for k, v in attrs if k == "id")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse_html(text: str) -> _StrictHTML:
    parser = _StrictHTML()
    parser.feed(text)
    parser.close()
    assert parser.stack == [], f"unclosed: {parser.stack}"
    return parser


def test_formats_registry_offers_junit_md_html_json():
    assert set(FORMATS) == {"junit", "md", "html", "json"}


def test_junit_has_a_testcase_per_failing_bucket_each_with_one_failure(planted_run):
    root = ET.fromstring(render_dir(planted_run, "junit"))
    buckets = _buckets_in_jsonl(planted_run)
    assert len(buckets) >= 2
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    failures = [f for tc in cases for f in tc.findall("failure")]
    assert sorted(tc.get("name") for tc in cases) == sorted(
        f"gather[{PLANTED}:gather] {kind} cause={cause}" for kind, _, _, cause in buckets
    )
    assert all(len(tc.findall("failure")) == 1 for tc in cases)  # CI viewers show only a testcase's first
    assert len(failures) == len(buckets)
    assert {f.get("type") for f in failures} == {k for k, *_ in buckets}
    for el in (root, suite):
        assert el.get("tests") == str(len(cases)) and el.get("failures") == str(len(failures))
        assert el.get("errors") == "0"


def test_junit_failure_carries_the_message_and_a_replay_command(planted_run):
    root = ET.fromstring(render_dir(planted_run, "junit"))
    for failure in root.iter("failure"):
        assert "Mismatched elements" in failure.get("message") or "NaN positions" in failure.get("message")
        replay_lines = [line for line in failure.text.splitlines() if line.startswith("replay: ")]
        assert len(replay_lines) == 1 and replay_lines[0].startswith(f"replay: {command()} ")
        assert "--seed 3" in replay_lines[0] or command("replay") in replay_lines[0]


def test_a_bundled_bucket_replays_with_its_bundle_command_in_every_format(tmp_path):
    f = Finding(
        kind=Kind.OOB_WRITE,
        op="gather",
        impl="cuda",
        case_id="c1",
        message="guard bytes changed",
        cause="dst:guard_after",
    )
    bundle = {
        "bucket": list(f.dedup_key),
        "path": "/runs/x/bundles/b1",
        "replay": "mlafuzz replay /runs/x/bundles/b1",
        "size": {"requests": 1, "rows": 2},
    }
    run = _write_run(tmp_path / "run", [f], summary={"cases": 3, "per_op": {"gather": 3}, "bundles": [bundle]})
    for fmt in FORMATS:
        assert "mlafuzz replay /runs/x/bundles/b1" in render_dir(run, fmt), fmt
    assert "minimized to requests 1, rows 2" in render_dir(run, "html")
    assert any(
        "mlafuzz replay /runs/x/bundles/b1" in line for line in findings_table([f], Judgement(), bundles=[bundle])
    )


def test_markdown_and_json_agree_with_the_junit_counts(planted_run):
    root = ET.fromstring(render_dir(planted_run, "junit"))
    doc = json.loads(render_dir(planted_run, "json"))
    md = render_dir(planted_run, "md")
    failures = int(root.get("failures"))
    findings = len([f for f in read_findings(planted_run / "findings.jsonl") if f.severity is Severity.ERROR])
    assert doc["status"] == "failed" and doc["tests"] == int(root.get("tests")) and doc["failures"] == failures
    assert doc["counts"]["failure_findings"] == findings == doc["counts"]["findings_lines"]
    assert {tuple(b[k] for k in ("kind", "op", "impl", "cause")) for b in doc["buckets"]} == _buckets_in_jsonl(
        planted_run
    )
    assert all(b["replay"].startswith(command() + " ") for b in doc["buckets"])
    assert md.startswith(f"## \u274c mlafuzz: {failures} failing buckets ({findings} findings)")
    assert md.count("<details>") == failures == md.count("</details>")
    for b in doc["buckets"]:
        assert b["replay"] in md


def test_html_is_well_formed_self_contained_and_details_every_bucket(planted_run):
    page = render_dir(planted_run, "html")
    parsed = _parse_html(page)
    report = report_of(planted_run)
    assert {b.slug for b in report.buckets} <= parsed.ids
    assert "script" not in parsed.tags and "link" not in parsed.tags and "http://" not in page
    text = " ".join(parsed.text)
    for kind, _op, _impl, cause in _buckets_in_jsonl(planted_run):
        assert kind in text and cause in text
    assert "Expected vs actual" in text and "Replay" in text and "seq_starts" in text  # a feature row


def test_every_format_escapes_a_script_tag_in_a_finding(tmp_path):
    evil = "<script>alert('x')</script> & \"quotes\" | `tick`"
    run = _write_run(
        tmp_path / "run",
        [
            Finding(
                kind=Kind.VALUE_MISMATCH,
                op="gather",
                impl="evil<b>impl",
                case_id="c<1>",
                message=evil,
                cause="dst:<i>",
                mismatches=(Mismatch(index=(0, 1), expected="<e>", actual="0x\x00ff"),),
            )
        ],
        summary={"cases": 1, "per_op": {"gather": 1}, "findings": 1},
    )
    page = render_dir(run, "html")
    parsed = _parse_html(page)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "script" not in parsed.tags and "b" not in parsed.tags and "i" not in parsed.tags
    assert evil in " ".join(parsed.text)  # escaped, not dropped
    md = render_dir(run, "md")
    assert "<script>" not in md and "&lt;script&gt;" in md
    root = ET.fromstring(render_dir(run, "junit"))  # a NUL from the impl must not break the XML
    assert "<script>" in root.find(".//failure").get("message")


def test_info_findings_are_shown_but_never_fail(tmp_path):
    info = Finding(
        kind=Kind.ACCEPTED_INVALID_INPUT,
        op="gather",
        impl="torch",
        case_id="c1",
        message="ran anyway",
        cause="wrong_shape",
        severity=Severity.INFO,
    )
    run = _write_run(tmp_path / "run", [info], summary={"cases": 3, "per_op": {"gather": 3}, "infos": 1})
    root = ET.fromstring(render_dir(run, "junit"))
    assert root.get("failures") == "0" and root.get("tests") == "1"
    assert "ran anyway" in root.find(".//system-out").text
    doc = json.loads(render_dir(run, "json"))
    assert doc["status"] == "passed" and doc["counts"]["info_buckets"] == 1
    assert "ran anyway" in render_dir(run, "md") and "ran anyway" in render_dir(run, "html")


def test_a_killed_run_without_summary_is_reported_from_its_findings(tmp_path):
    f = Finding(kind=Kind.CRASH, op="gather", impl="cuda", case_id="c1", message="worker killed by SIGSEGV")
    run = _write_run(tmp_path / "run", [f])
    with (run / "findings.jsonl").open("a") as fh:
        fh.write('{"kind": "VALUE_MIS')  # torn last line
    doc = json.loads(render_dir(run, "json"))
    assert doc["failures"] == 1 and any("no summary.json" in n for n in doc["notes"])
    assert "no summary.json" in render_dir(run, "md")


def test_render_refuses_unknown_formats_and_directories_that_are_not_runs(tmp_path, planted_run):
    with pytest.raises(ReportError, match="fmt='pdf' must be one of"):
        render_dir(planted_run, "pdf")
    with pytest.raises(ReportError, match="no such directory"):
        render_dir(tmp_path / "nope", "md")
    with pytest.raises(ReportError, match="not an mlafuzz run directory"):
        render_dir(tmp_path, "md")


def test_console_table_prints_a_row_per_bucket_failures_first(planted_run):
    from mlafuzz.harness.ledger import judge

    findings = read_findings(planted_run / "findings.jsonl")
    lines = findings_table(findings, judge(findings))
    out = "\n".join(lines)
    assert sum(line.startswith("failure") for line in lines) == len(_buckets_in_jsonl(planted_run))
    assert "VALUE_MISMATCH" in out and "NAN_MISMATCH" in out and "dst:value" in out


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory) -> Path:
    """A run whose bucket has more findings than findings.jsonl keeps lines of (the cap set to 2)."""
    import mlafuzz.harness.drive.fuzz as fuzz_module

    out = tmp_path_factory.mktemp("capped")
    cap, fuzz_module.MAX_LINES_PER_BUCKET = fuzz_module.MAX_LINES_PER_BUCKET, 2
    try:
        rc = main(
            [
                "fuzz",
                "--op",
                "gather",
                "--impl",
                "gather=gather_skip_last_row",
                "--device",
                "cpu",
                "--cases",
                "12",
                "--in-process",
                "--quiet",
                "--shrink-budget",
                "0",
                "--out",
                str(out),
            ]
        )
    finally:
        fuzz_module.MAX_LINES_PER_BUCKET = cap
    assert rc == 1
    return out


def test_every_format_counts_a_buckets_findings_not_the_lines_kept_of_it(capped_run):
    summary = json.loads((capped_run / "summary.json").read_text())
    n = summary["findings"]
    assert n > 2 and len(read_findings(capped_run / "findings.jsonl")) == 2
    assert sum(summary["bucket_counts"].values()) == n + summary["infos"]
    assert summary["lines_dropped"] == sum(summary["bucket_counts"].values()) - 2  # what the cap left out
    report = report_of(capped_run)
    assert report.headline().startswith(f"mlafuzz: 1 failing bucket ({n} findings) in 1 of 1 implementation,")
    doc = json.loads(render_dir(capped_run, "json"))
    assert doc["counts"]["failure_findings"] == n and doc["buckets"][0]["findings"] == n
    assert doc["buckets"][0]["findings_lines"] == 2
    assert f"{n} findings, severity error" in ET.fromstring(render_dir(capped_run, "junit")).find(".//failure").text
    md = render_dir(capped_run, "md")
    assert f"| {n} |" in md and f"\u2014 {n} findings</summary>" in md
    page = render_dir(capped_run, "html")
    assert f"{n - 1} more findings in this bucket (2 recorded in findings.jsonl)" in page


def test_counts_read_one_and_many_as_english(tmp_path):
    f = Finding(kind=Kind.CRASH, op="gather", impl="cuda", case_id="c1", message="worker killed by SIGSEGV")
    run = _write_run(tmp_path / "run", [f], summary={"cases": 1, "per_op": {"gather": 1}, "findings": 1})
    headline = report_of(run).headline()
    assert headline == "mlafuzz: 1 failing bucket (1 finding) in 1 of 1 implementation, 1 case"
    assert "1 finding</summary>" in render_dir(run, "md") and "1 finding<" in render_dir(run, "html")


def test_report_on_a_run_killed_before_its_summary_says_incomplete_not_passed(tmp_path):
    f = Finding(kind=Kind.CRASH, op="gather", impl="cuda", case_id="c1", message="m", severity=Severity.INFO)
    run = _write_run(tmp_path / "run", [f])  # findings.jsonl only: the run was killed with kill -9
    (run / "run.json").write_text(json.dumps({"ops": ["gather"], "impls": {"gather": "cuda"}, "seed": 1}))
    md = render_dir(run, "md")
    assert md.startswith("## \u26a0\ufe0f mlafuzz: incomplete run (no summary.json: the run was killed")
    assert "passed" not in md.splitlines()[0]
    root = ET.fromstring(render_dir(run, "junit"))
    assert root.get("errors") == "1"
    assert [e.get("message") for e in root.iter("error")] == [
        "incomplete run: no summary.json: the run was killed or is still running"
    ]
    assert json.loads(render_dir(run, "json"))["incomplete"].startswith("no summary.json")
    assert '<div class="verdict incomplete">' in render_dir(run, "html")
