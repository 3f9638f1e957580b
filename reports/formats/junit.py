"""JUnit XML: a testcase per op and implementation, a <failure> per failing finding bucket.

``tests`` counts testcases and ``failures`` counts <failure> elements, which
is the number of failing buckets (error severity, not waived by a ledger) in
findings.jsonl. Expected (ledger-waived) and INFO buckets never become
failures: they go to the testcase's <system-out>, so CI still shows them.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from mlafuzz.reports.formats.text import bucket_block, one_line
from mlafuzz.reports.model import RunReport, TestCase

# Characters XML 1.0 cannot carry at all (an impl's exception text may hold them).
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(text: object) -> str:
    return _XML_ILLEGAL.sub("\ufffd", str(text))


def _testcase(parent: ET.Element, tc: TestCase, report: RunReport) -> None:
    el = ET.SubElement(
        parent, "testcase", classname=_clean(f"mlafuzz.{tc.op}"), name=_clean(tc.name), time=f"{tc.seconds:.3f}"
    )
    for b in tc.failures:
        failure = ET.SubElement(
            el,
            "failure",
            type=b.kind,
            message=_clean(one_line(f"{b.kind} cause={b.cause or '-'}: {b.first.message}", 500)),
        )
        failure.text = _clean(bucket_block(b, report))
    quiet = [b for b in tc.buckets if not b.is_failure]
    if quiet:
        out = ET.SubElement(el, "system-out")
        out.text = _clean("\n\n".join(f"[{b.status}] {bucket_block(b, report)}" for b in quiet))


def render_junit(report: RunReport) -> str:
    tests, failures = len(report.testcases), sum(len(tc.failures) for tc in report.testcases)
    seconds = f"{float(report.summary.get('seconds') or 0.0):.3f}"
    counts = {"tests": str(tests), "failures": str(failures), "errors": "0", "skipped": "0", "time": seconds}
    root = ET.Element("testsuites", name="mlafuzz", **counts)
    suite = ET.SubElement(root, "testsuite", name="mlafuzz", **counts)
    props = ET.SubElement(suite, "properties")
    meta = {
        "run_dir": str(report.run_dir),
        "cases": report.summary.get("cases"),
        "skipped_cases": report.summary.get("skipped"),
        "findings_lines": len(report.findings),
        **{k: report.run.get(k) for k in ("seed", "device", "shard")},
    }
    for name, value in meta.items():
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_clean(value))
    for tc in report.testcases:
        _testcase(suite, tc, report)
    if report.stale:
        err = ET.SubElement(suite, "system-err")
        err.text = _clean(
            "\n".join(f"stale ledger entry {e.label()} ({e.issue}): matched no finding" for e in report.stale)
        )
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
