"""The revision hint (issue 30, item 6): when an output mismatches under the case's contract revision
but equals, byte for byte, what another revision's oracle makes, the finding says which revision
and how to ask for it ("matches revision 2026-07 exactly: --revision 2026-07"). A user with an
older build then need not guess.

The other revisions are the revision table's, one per value of the rule the op's output depends
on (the newest revision with that value), tried newest first; a value the oracle does not know
is skipped. Only a mismatching case pays for it: one oracle run per other value.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.oracles import revisions
from mlafuzz.reports.findings import Finding, Kind

_HINTED = (Kind.VALUE_MISMATCH, Kind.NAN_MISMATCH, Kind.SUBNORMAL_FLUSH)


def _same_bytes(a: Any, b: Any) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def matching_revision(
    case: Case,
    actual: Any,
    *,
    oracle: Callable[[Case], Mapping[str, Any]],
    output: str,
    rule: str,
    same: Callable[[Case, Any, Any], bool] | None = None,
) -> str | None:
    """The other revision (by ``rule``'s value) whose oracle makes ``actual`` exactly, or None.
    Of the revisions with a value, the one that differs from the case's in the fewest rules is
    named (the user changes one thing), the newest of those. ``same(case, expected, actual)``: how
    that revision's case judges the output (default: byte for byte; a convert's compacted rows are
    multisets)."""
    current = revisions.get(case.params.get("revision") or revisions.newest())
    seen = {current.rule(rule)}

    def distance(row: revisions.Revision) -> int:
        return sum(row.rules[k] != v for k, v in current.rules.items())

    for row in sorted(reversed(revisions.TABLE.rows), key=distance):
        value = row.rule(rule)
        if value in seen:
            continue
        seen.add(value)
        other = dataclasses.replace(case, params={**case.params, "revision": row.name})
        try:
            expected = oracle(other)[output]
        except (KeyError, ValueError):  # a rule value this oracle does not implement
            continue
        if same(other, expected, actual) if same is not None else _same_bytes(expected, actual):
            return row.name
    return None


def hint_revision(
    case: Case,
    call: Any,
    findings: list[Finding],
    *,
    oracle: Callable[[Case], Mapping[str, Any]],
    output: str,
    rule: str,
    same: Callable[[Case, Any, Any], bool] | None = None,
) -> list[Finding]:
    """``findings`` with each mismatch of ``output`` saying which other revision it matches exactly."""
    if not any(f.kind in _HINTED and f.tensor == output for f in findings):
        return findings
    actual = (call.outputs or {}).get(output)
    if not isinstance(actual, torch.Tensor):
        return findings
    other = matching_revision(case, actual, oracle=oracle, output=output, rule=rule, same=same)
    if other is None:
        return findings
    value = revisions.get(other).rule(rule)
    hint = f"matches revision {other} exactly ({rule} {value}): --revision {other}"
    return [
        dataclasses.replace(f, message=f"{f.message}; {hint}", extra={**f.extra, "matches_revision": other})
        if f.kind in _HINTED and f.tensor == output
        else f
        for f in findings
    ]
