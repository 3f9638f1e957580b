"""JUnit XML: a testcase per failing finding bucket (one <failure> each), and one per op and
implementation that has none.

Most CI viewers show only a testcase's first <failure>, so a bucket never
shares its testcase: ``failures`` is the number of failing buckets (error
severity, not waived by a ledger), ``tests`` that plus the implementations
that passed. Expected (ledger-waived) and INFO buckets never become failures:
they go to a <system-out> of their implementation, so CI still shows them. A
run without summary.json (killed) adds a testcase with an <error>: it is not
a pass.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from mlafuzz.reports.formats.text import bucket_block, one_line
from mlafuzz.reports.model import NOT_APPLICABLE, RunReport, TestCase

# Characters XML 1.0 cannot carry at all (an impl's exception text may hold them).
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(text: object) -> str:
    return _XML_ILLEGAL.sub("\ufffd", str(text))


def _testcases(parent: ET.Element, tc: TestCase, report: RunReport) -> None:
    failing = tc.failures
    seconds = f"{tc.seconds / max(1, len(failing)):.3f}"  # the implementation's time, shared by its testcases
    elements = []
    for b in failing:
        name = f"{tc.name} {b.kind} cause={b.cause or '-'}"
        el = ET.SubElement(parent, "testcase", classname=_clean(f"mlafuzz.{tc.op}"), name=_clean(name), time=seconds)
        failure = ET.SubElement(
            el,
            "failure",
            type=b.kind,
            message=_clean(one_line(f"{b.kind} cause={b.cause or '-'}: {b.first.message}", 500)),
        )
        failure.text = _clean(bucket_block(b, report))
        elements.append(el)
    if not failing:
        elements.append(
            ET.SubElement(parent, "testcase", classname=_clean(f"mlafuzz.{tc.op}"), name=_clean(tc.name), time=seconds)
        )
    quiet = [b for b in tc.buckets if not b.is_failure]
    if quiet:
        out = ET.SubElement(elements[0], "system-out")
        out.text = _clean("\n\n".join(f"[{b.status}] {bucket_block(b, report)}" for b in quiet))


def render_junit(report: RunReport) -> str:
    failures = sum(len(tc.failures) for tc in report.testcases)
    seconds = f"{float(report.summary.get('seconds') or 0.0):.3f}"
    errors = "1" if report.incomplete else "0"
    counts = {"tests": str(report.tests), "failures": str(failures), "errors": errors, "skipped": "0", "time": seconds}
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
        _testcases(suite, tc, report)
    if report.incomplete:
        el = ET.SubElement(suite, "testcase", classname="mlafuzz.run", name="run[complete]", time="0.000")
        ET.SubElement(el, "error", type="incomplete", message=_clean(f"incomplete run: {report.incomplete}"))
    ledger_lines = [f"stale ledger entry {e.label()} ({e.issue}): matched no finding" for e in report.stale]
    ledger_lines += [f"ledger entry {e.label()} ({e.issue}): {NOT_APPLICABLE}" for e in report.not_applicable]
    if ledger_lines:
        err = ET.SubElement(suite, "system-err")
        err.text = _clean("\n".join(ledger_lines))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
