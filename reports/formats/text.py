"""Plain-text pieces shared by the formats: one-line messages, a bucket's detail block."""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from mlafuzz.reports.findings import Finding
from mlafuzz.reports.model import Bucket, RunReport, plural

MAX_MISMATCHES = 8  # per finding, in detail blocks
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")


def one_line(text: str, limit: int = 300) -> str:
    """Whitespace collapsed to single spaces, cut at ``limit`` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


def xor_bits(expected: str, actual: str) -> str:
    """The differing bits of two same-width hex renderings ('' when they aren't both hex)."""
    if not (_HEX.match(expected) and _HEX.match(actual)) or len(expected) != len(actual):
        return ""
    return f"0x{int(expected, 16) ^ int(actual, 16):0{len(expected) - 2}x}"


def spec_json(finding: Finding) -> str:
    return json.dumps(finding.spec, sort_keys=True) if finding.spec is not None else ""


def finding_facts(finding: Finding) -> list[tuple[str, str]]:
    """(label, value) pairs worth showing for one finding, only those it has."""
    facts = [("case", finding.case_id)]
    if finding.seed is not None:
        facts.append(("seed", str(finding.seed)))
    if finding.tensor:
        facts.append(("tensor", finding.tensor))
    if finding.total:
        share = 100.0 * finding.count / finding.total
        facts.append(("mismatched", f"{finding.count} / {finding.total} ({share:.1f}%)"))
    elif finding.count:
        facts.append(("mismatched", str(finding.count)))
    if finding.max_ulp is not None:
        facts.append(("max ulp", str(finding.max_ulp)))
    if finding.revision:
        facts.append(("revision", finding.revision))
    shard = finding.extra.get("shard") if isinstance(finding.extra, Mapping) else None
    if isinstance(shard, Mapping):
        label = shard.get("label")
        facts.append(
            (
                "shard",
                f"{'shard ' + label if label else 'input #' + str(shard.get('index', '?'))}"
                f" of the merge, from {shard.get('dir', '?')}",
            )
        )
    return facts


def bundle_text(bundle: Mapping[str, Any] | None) -> str:
    """'PATH (minimized to requests 1, rows 1)' for a summary.json bundle entry; '' without one."""
    if not bundle:
        return ""
    size = bundle.get("size")
    sized = ", ".join(f"{k} {v}" for k, v in size.items()) if isinstance(size, Mapping) else ""
    return f"{bundle.get('path', '?')}{f' (minimized to {sized})' if sized else ''}"


def bucket_block(bucket: Bucket, report: RunReport) -> str:
    """The plain-text story of a bucket: its first finding in full and the replay command."""
    f = bucket.first
    lines = [f"{bucket.title()}: {plural(bucket.count, 'finding')}, severity {bucket.severity.value}"]
    if bucket.waiver is not None:
        lines.append(f"expected per ledger {bucket.waiver.label()}: {bucket.waiver.issue}")
    lines.append(f"message: {f.message}")
    lines += [f"{label}: {value}" for label, value in finding_facts(f)]
    if f.mismatches:
        lines.append("first mismatches (index: expected -> actual):")
        lines += [f"  {list(m.index)}: {m.expected} -> {m.actual}" for m in f.mismatches[:MAX_MISMATCHES]]
    if f.spec is not None:
        lines.append(f"spec: {spec_json(f)}")
    others = [g.case_id for g in bucket.findings[1:6]]
    if others:
        lines.append(f"also in: {', '.join(others)}{' ...' if bucket.count > 6 else ''}")
    bundle = bundle_text(report.bundle_for(bucket))
    if bundle:
        lines.append(f"bundle: {bundle}")
    replay = report.replay(f)
    lines.append(f"replay: {replay}" if replay else "replay: no repro bundle recorded (re-run with the case's seed)")
    return "\n".join(lines)
