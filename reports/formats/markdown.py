"""Markdown for a CI step summary (GitHub's $GITHUB_STEP_SUMMARY, GitLab, a PR comment).

Counts match the JUnit report's. Everything from a finding is escaped for
GitHub-flavoured Markdown: table cells can't be split by ``|``, text can't
open HTML tags, code spans pick a fence longer than any backtick run inside.
The summary stays well under GitHub's 1 MiB limit by capping the buckets
shown in full.
"""

from __future__ import annotations

import html
import re

from mlafuzz.reports.formats.text import bundle_text, finding_facts, one_line, spec_json, xor_bits
from mlafuzz.reports.model import NOT_APPLICABLE, Bucket, RunReport, plural

MAX_DETAILED_BUCKETS = 30
_STATUS_ICON = {
    "failure": "\u274c",
    "expected": "\u2796",
    "info": "\u2139\ufe0f",
    "passed": "\u2705",
    "failed": "\u274c",
}


def text(value: object, limit: int = 300) -> str:
    """Inline text: one line, HTML-escaped, Markdown punctuation that could restyle it escaped."""
    flat = html.escape(one_line(str(value), limit), quote=False)
    return re.sub(r"([\\`*_\[\]|#~])", r"\\\1", flat)


def code(value: object, limit: int = 300) -> str:
    """An inline code span that survives backticks and table pipes inside it."""
    flat = one_line(str(value), limit).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def block(value: str, lang: str = "") -> str:
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{value}\n{fence}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _stats(report: RunReport) -> list[str]:
    s = report.summary
    cells = [
        ("cases", s.get("cases", "?")),
        ("skipped", s.get("skipped", "?")),
        ("failing buckets", len(report.failures)),
        ("failing findings", report.count("failure")),
        ("expected buckets", len(report.buckets_with("expected"))),
        ("info buckets", len(report.buckets_with("info"))),
        ("seconds", s.get("seconds", "?")),
        ("cases/s", s.get("cases_per_second", "?")),
    ]
    return _table([c[0] for c in cells], [[text(c[1]) for c in cells]])


def _bucket_details(b: Bucket, report: RunReport) -> list[str]:
    f = b.first
    out = [
        "<details>",
        f"<summary>{_STATUS_ICON[b.status]} <b>{html.escape(b.kind)}</b> "
        f"{html.escape(b.op)}={html.escape(one_line(b.impl, 120))} cause={html.escape(b.cause or '-')}"
        f" \u2014 {plural(b.count, 'finding')}</summary>",
        "",
    ]
    if b.waiver is not None:
        out += [f"Expected per ledger {text(b.waiver.label())}: {text(b.waiver.issue)}", ""]
    out += [text(f.message, 1000), ""]
    out += [f"- {label}: {code(value)}" for label, value in finding_facts(f)]
    if report.bundle_for(b):
        out.append(f"- repro bundle: {code(bundle_text(report.bundle_for(b)))}")
    if f.mismatches:
        rows = [
            [code(list(m.index)), code(m.expected), code(m.actual), code(xor_bits(m.expected, m.actual) or "-")]
            for m in f.mismatches[:8]
        ]
        out += ["", *_table(["index", "expected", "actual", "xor"], rows)]
    if f.spec is not None:
        out += ["", "Spec:", "", block(spec_json(f), "json")]
    replay = report.replay(f)
    out += ["", "Replay:", "", block(replay, "sh") if replay else "_no repro bundle recorded_", "", "</details>", ""]
    return out


def render_markdown(report: RunReport) -> str:
    icon = _STATUS_ICON["passed" if report.passed else "failed"]
    if report.incomplete and report.passed:
        icon = "\u26a0\ufe0f"  # not a pass: the run never said it finished
    out = [f"## {icon} {text(report.headline(), 400)}", ""]
    out += [
        f"Run directory: {code(report.run_dir)}"
        + (f" \u00b7 seed {code(report.run['seed'])}" if "seed" in report.run else "")
        + (f" \u00b7 device {code(report.run['device'])}" if "device" in report.run else "")
        + (f" \u00b7 ledger {code(report.ledger)}" if report.ledger else ""),
        "",
    ]
    out += [*_stats(report), ""]
    out += [f"> {text(n)}" for n in report.notes] + ([""] if report.notes else [])
    out += ["### Implementations", ""]
    out += _table(
        ["status", "op", "impl", "cases", "failing buckets", "failing findings"],
        [
            [
                _STATUS_ICON[tc.status],
                code(tc.op),
                code(tc.impl, 120),
                text(tc.cases if tc.cases is not None else "?"),
                str(len(tc.failures)),
                str(sum(b.count for b in tc.failures)),
            ]
            for tc in report.testcases
        ],
    )
    out.append("")
    if report.buckets:
        out += ["### Finding buckets", ""]
        out += _table(
            ["", "kind", "op", "impl", "cause", "findings", "first message"],
            [
                [
                    _STATUS_ICON[b.status],
                    code(b.kind),
                    code(b.op),
                    code(b.impl, 80),
                    code(b.cause or "-"),
                    str(b.count),
                    text(b.first.message, 160),
                ]
                for b in report.buckets
            ],
        )
        out.append("")
        out += ["### Details", ""]
        for b in report.buckets[:MAX_DETAILED_BUCKETS]:
            out += _bucket_details(b, report)
        if len(report.buckets) > MAX_DETAILED_BUCKETS:
            out += [f"_{len(report.buckets) - MAX_DETAILED_BUCKETS} more buckets: see the HTML or JSON report._", ""]
    if report.stale:
        out += ["### Stale ledger entries", "", "These matched no finding; remove them if the bug is fixed.", ""]
        out += [f"- {text(e.label())}: {text(e.issue)}" for e in report.stale]
        out.append("")
    if report.not_applicable:
        out += ["### Ledger entries not applicable to this run", "", f"These are {NOT_APPLICABLE}.", ""]
        out += [f"- {text(e.label())}: {text(e.issue)}" for e in report.not_applicable]
        out.append("")
    return "\n".join(out)
