"""The full path: copies, two guarded runs, the oracle and the comparator, for the exact finding.

The first run is held to the oracle; its red zones, guard zones and inputs are
checked. For guarded outputs (or a sampled re-run) a second run over the other
fill follows: its guard zones, the two runs' write map, and the re-run's
agreement with the first. Every case on the CPU takes this path, and any case
the GPU fast path flags (harness/fast).

One cause, one finding: elements the write map shows were never written are
MISSING_WRITE's, and the comparator leaves them out (their bytes are the fill
pattern, so comparing them would file the same bug again as VALUE_MISMATCH
and NAN_MISMATCH); mismatches anywhere else are still reported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.harness.check.calls import Call, call_copied, first_line, own_traceback
from mlafuzz.harness.check.compare import Context, Policy, compare
from mlafuzz.harness.check.detectors import (
    input_mutations,
    launch_error_findings,
    redzone_findings,
    rerun_differs,
)
from mlafuzz.harness.check.narrow import narrow, narrowed_names
from mlafuzz.harness.check.stages import stage
from mlafuzz.harness.memory.guards import PATTERNS, never_written, oob_findings, write_map_findings
from mlafuzz.harness.memory.redzone import RedZone
from mlafuzz.harness.ops.op import Op
from mlafuzz.reports.findings import Finding, Kind


def review(op: Op, case: Case, call: Call, findings: list[Finding], ctx: Context) -> list[Finding]:
    """The op's own re-filing of the first call's findings (e.g. metadata -> METADATA_MISMATCH)."""
    return list(op.review(case, call, findings, ctx)) if op.review else findings


def full_path(
    *,
    op: Op,
    case: Case,
    fn: Callable,
    ctx: Context,
    policy: Policy,
    rerun: bool,
    sub: Callable[[str], Callable],
    oracle: Callable[[Case], Mapping[str, Any]] | None = None,
    redzone: RedZone | None = None,
) -> list[Finding]:
    """Every finding of ``case`` on ``fn`` (see the module docstring); ``oracle`` overrides the
    op's vectorized one (the loop oracle, for minimized cases)."""
    with stage("run"):
        first = call_copied(op=op, fn=fn, case=case, fill=PATTERNS[0], sub=sub, redzone=redzone)
    findings: list[Finding] = redzone_findings(first, ctx) + launch_error_findings(first, ctx)
    if first.error is not None:
        findings.append(
            Finding(
                kind=Kind.EXCEPTION,
                op=ctx.op,
                impl=ctx.impl,
                case_id=ctx.case_id,
                cause=type(first.error).__name__,
                message=f"raised on a valid input: {first_line(first.error)}",
                extra={"traceback": own_traceback(first.error)},
            )
        )
        return review(op, case, first, findings, ctx) + input_mutations(case, first.inputs, ctx, inplace=op.inplace)
    if first.launch_error is not None:  # the context may not take another call as it should: say what was seen
        return findings
    with stage("inputs"):
        mutated = input_mutations(case, first.inputs, ctx, inplace=op.inplace)
        first, head = narrow(op, case, first, ctx)
    second = None
    if first.guards or rerun:
        # Unchanged inputs are passed again rather than copied again: at realistic sizes a copy
        # of the cache costs about as much as the kernel under test.
        with stage("rerun"):
            second = call_copied(
                op=op,
                fn=fn,
                case=case,
                fill=PATTERNS[1],
                sub=sub,
                reuse=None if mutated else first.inputs,
                redzone=redzone,
            )
            second, _ = narrow(op, case, second, ctx)  # the first run's writes there are reported
    unwritten = {}
    if second is not None and second.error is None:
        with stage("guards"):
            unwritten = {
                name: m for name, g in second.guards.items() if (m := never_written(first.guards[name], g)) is not None
            }
    with stage("oracle"):
        expected = (oracle or op.oracle)(case)
        sets = op.row_sets(case, expected) if op.row_sets else {}  # outputs compared as row multisets
        findings += compare(
            expected=expected,
            actual=first.outputs,
            policy=policy,
            ctx=ctx,
            row_sets=sets,
            skip=unwritten,
            origin=narrowed_names(op, case),
        )
        findings += head
    findings = review(op, case, first, findings, ctx)
    with stage("guards"):
        for name, g in first.guards.items():
            findings += oob_findings(name=name, g=g, op=ctx.op, impl=ctx.impl, case_id=ctx.case_id)
    findings += mutated
    if second is not None:
        findings += launch_error_findings(second, ctx) if not first.launch_error else []
        if second.error is not None:
            findings.append(
                Finding(
                    kind=Kind.NONDETERMINISM,
                    op=ctx.op,
                    impl=ctx.impl,
                    case_id=ctx.case_id,
                    cause="rerun_raised",
                    message=f"a second run of the same case raised: {first_line(second.error)}",
                )
            )
        else:
            with stage("guards"):
                for name, g in second.guards.items():
                    findings += [
                        f
                        for f in oob_findings(name=name, g=g, op=ctx.op, impl=ctx.impl, case_id=ctx.case_id)
                        if not any(f.dedup_key == h.dedup_key for h in findings)
                    ]
                    findings += write_map_findings(
                        name=name, run_a=first.guards[name], run_b=g, op=ctx.op, impl=ctx.impl, case_id=ctx.case_id
                    )
                findings += rerun_differs(first, second, ctx, unordered=frozenset(sets))
    return fold_misplaced(findings)


# What a write outside an output explains inside it: rows written to the wrong place leave the
# right ones unwritten or holding another row's values.
_EXPLAINED_BY_OOB = (Kind.MISSING_WRITE, Kind.VALUE_MISMATCH, Kind.NAN_MISMATCH, Kind.SUBNORMAL_FLUSH)


def fold_misplaced(findings: list[Finding]) -> list[Finding]:
    """One cause, one bucket: where a guarded output was written outside its bounds (OOB_WRITE
    on that tensor), its own missing writes and value mismatches are the same misplaced writes
    seen from inside, and are folded into the OOB_WRITE (named in its message and
    ``extra["folded"]``), not reported as other buckets."""
    oob = {f.tensor: f for f in findings if f.kind is Kind.OOB_WRITE and f.tensor is not None}
    if not oob:
        return findings
    folded: dict[str, list[Finding]] = {}
    kept = []
    for f in findings:
        if f.kind in _EXPLAINED_BY_OOB and f.tensor in oob:
            folded.setdefault(f.tensor, []).append(f)
        else:
            kept.append(f)
    out = []
    for f in kept:
        inside = folded.get(f.tensor) if f.kind is Kind.OOB_WRITE else None
        if inside:
            what = ", ".join(f"{g.kind.value} ({g.count} elements)" for g in inside)
            f = dataclasses.replace(
                f,
                message=f"{f.message}; inside it, the same misplaced writes: {what}",
                extra={
                    **f.extra,
                    "folded": [{"kind": g.kind.value, "cause": g.cause, "count": g.count} for g in inside],
                },
            )
            folded.pop(f.tensor)
        out.append(f)
    return out
