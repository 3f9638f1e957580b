"""The JSON summary: the run's verdict, counts, implementations and buckets, for machines.

Counts agree with the JUnit and Markdown reports: ``failures`` is the number
of failing buckets (a JUnit <failure> each), ``tests`` the number of
op/implementation testcases.
"""

from __future__ import annotations

import json
from typing import Any

from mlafuzz.reports.model import Bucket, RunReport

SCHEMA_VERSION = 1


def bucket_json(b: Bucket, report: RunReport) -> dict[str, Any]:
    f = b.first
    return {
        "kind": b.kind,
        "op": b.op,
        "impl": b.impl,
        "cause": b.cause,
        "status": b.status,
        "severity": b.severity.value,
        "findings": b.count,
        "findings_lines": len(b.findings),
        "max_ulp": b.max_ulp,
        "case_ids": [g.case_id for g in b.findings],
        "message": f.message,
        "first": f.to_json(),
        "replay": report.replay(f),
        "waiver": b.waiver.to_json() if b.waiver is not None else None,
    }


def summary_json(report: RunReport) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run_dir": str(report.run_dir),
        "status": report.status,
        "incomplete": report.incomplete,
        "headline": report.headline(),
        "tests": report.tests,
        "failures": len(report.failures),
        "counts": {
            "findings_lines": len(report.findings),
            **{f"{s}_buckets": len(report.buckets_with(s)) for s in ("failure", "expected", "info")},
            **{f"{s}_findings": report.count(s) for s in ("failure", "expected", "info")},
        },
        "summary": dict(report.summary),
        "run": dict(report.run),
        "testcases": [
            {
                "op": t.op,
                "impl": t.impl,
                "name": t.name,
                "status": t.status,
                "cases": t.cases,
                "failures": [b.key for b in t.failures],
                "buckets": [b.key for b in t.buckets],
            }
            for t in report.testcases
        ],
        "buckets": [bucket_json(b, report) for b in report.buckets],
        "stale_ledger_entries": [e.to_json() for e in report.stale],
        "ledger": report.ledger,
        "not_applicable_ledger_entries": [e.to_json() for e in report.not_applicable],
        "notes": list(report.notes),
    }


def render_json(report: RunReport) -> str:
    return json.dumps(summary_json(report), indent=2, default=str) + "\n"
