"""One bug, one bucket, across an op's linked outputs.

Some outputs state one fact about each row twice: convert's ``out`` holds a row's slots and its
``valid_counts`` how many of them are valid, so a row converted wrong is usually wrong in both. Two
findings for it would make two buckets, two bundles, two shrinks and two JUnit failures for one
bug. The op row names such outputs (``Op.linked``); the value findings of one case on them whose
first wrong row is the same row (the comparator lists mismatches in row-major order, so that is
the first row each got wrong) are one cause: one finding, filed under the first output in the row's
order, whose cause joins every folded cause (``out:value+valid_counts:value``) and whose message
names every fact. Findings whose first wrong rows differ stay apart: a bug in the counts alone
keeps its own bucket.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from mlafuzz.reports.findings import Finding, Kind, Severity

_FOLDED_KINDS = (Kind.VALUE_MISMATCH, Kind.NAN_MISMATCH)


def _first_row(f: Finding) -> int | None:
    return f.mismatches[0].index[0] if f.mismatches and f.mismatches[0].index else None


def fold_linked(linked: Sequence[str], findings: list[Finding]) -> list[Finding]:
    """``findings`` with the value findings of ``linked`` outputs that share their first wrong row
    folded into one (see the module docstring)."""
    order = {name: i for i, name in enumerate(linked)}
    groups: dict[int, list[Finding]] = {}
    for f in findings:
        if f.kind in _FOLDED_KINDS and f.severity is Severity.ERROR and f.tensor in order:
            row = _first_row(f)
            if row is not None:
                groups.setdefault(row, []).append(f)
    merged: dict[int, Finding] = {}  # id of a group's first finding -> the folded finding
    dropped: set[int] = set()
    for group in groups.values():
        if len({f.tensor for f in group}) < 2:
            continue
        group = sorted(group, key=lambda f: order[f.tensor])
        head, rest = group[0], group[1:]
        merged[id(head)] = dataclasses.replace(
            head,
            cause="+".join(f.cause for f in group),
            message="; the same rows in ".join(f.message for f in group),
            mismatches=tuple(m for f in group for m in f.mismatches),
            extra={
                **head.extra,
                "linked": [{"tensor": f.tensor, "cause": f.cause, "count": f.count, "total": f.total} for f in rest],
            },
        )
        dropped.update(id(f) for f in rest)
    if not merged:
        return findings
    return [merged.get(id(f), f) for f in findings if id(f) not in dropped]
