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

A first call that failed on a known limit of Triton's CPU interpreter (check/interpreter.py) is
judged no further: ``EnvironmentLimit``, which the runner makes a counted skip.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.harness.check.calls import Call, call_copied
from mlafuzz.harness.check.compare import Context, Policy
from mlafuzz.harness.check.detectors import input_mutations
from mlafuzz.harness.check.interpreter import EnvironmentLimit, interpreter_limit
from mlafuzz.harness.check.narrow import narrow
from mlafuzz.harness.check.pipeline import DETECTORS, Detector, Evidence, run_detectors
from mlafuzz.harness.check.stages import stage
from mlafuzz.harness.memory.bits import differing
from mlafuzz.harness.memory.guards import PATTERNS, never_written
from mlafuzz.harness.memory.redzone import RedZone
from mlafuzz.harness.ops.op import Op
from mlafuzz.reports.findings import Finding, Kind


def review(op: Op, case: Case, call: Call, findings: list[Finding], ctx: Context) -> list[Finding]:
    """The op's own re-filing of the first call's findings (e.g. metadata -> METADATA_MISMATCH)."""
    return list(op.review(case, call, findings, ctx)) if op.review else findings


def gather(
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
) -> Evidence:
    """The calls of the full path and what they left: the first run, and for guarded outputs (or a
    sampled re-run) a second over the other fill, with the two runs' write map."""
    with stage("run"):
        first = call_copied(op=op, fn=fn, case=case, fill=PATTERNS[0], sub=sub, redzone=redzone)
    ev = Evidence(op=op, case=case, ctx=ctx, policy=policy, first=first, oracle=oracle)
    if first.error is not None:
        ev.mutated = input_mutations(case, first.inputs, ctx, inplace=op.inplace)
        return ev
    if first.launch_error is not None:  # the context may not take another call as it should: say what was seen
        return ev
    with stage("inputs"):
        ev.mutated = input_mutations(case, first.inputs, ctx, inplace=op.inplace)
        ev.first, ev.head = narrow(op, case, first, ctx)
    if ev.first.guards or rerun:
        # Unchanged inputs are passed again rather than copied again: at realistic sizes a copy
        # of the cache costs about as much as the kernel under test.
        with stage("rerun"):
            second = call_copied(
                op=op,
                fn=fn,
                case=case,
                fill=PATTERNS[1],
                sub=sub,
                reuse=None if ev.mutated else ev.first.inputs,
                redzone=redzone,
            )
            ev.second, _ = narrow(op, case, second, ctx)  # the first run's writes there are reported
    if ev.second is not None and ev.second.error is None:
        with stage("guards"):
            # Which outputs the two runs left differently, for all of them in one sync (issue 29).
            names = list(ev.second.guards)
            pairs = [(ev.first.guards[name].region(), ev.second.guards[name].region()) for name in names]
            ev.rewritten = dict(zip(names, differing(pairs)))
            ev.unwritten = {
                name: m
                for name, g in ev.second.guards.items()
                if (m := never_written(ev.first.guards[name], g, differ=ev.rewritten[name])) is not None
            }
    return ev


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
    detectors: tuple[Detector, ...] = DETECTORS,
) -> list[Finding]:
    """Every finding of ``case`` on ``fn`` (see the module docstring): the calls (``gather``), then
    each of ``detectors`` in order (check/pipeline.py); ``oracle`` overrides the op's vectorized one
    (the loop oracle, for minimized cases)."""
    ev = gather(op=op, case=case, fn=fn, ctx=ctx, policy=policy, rerun=rerun, sub=sub, oracle=oracle, redzone=redzone)
    reason = interpreter_limit(ev.first.error)
    if reason is not None:  # the environment failed, not the implementation: nothing to judge
        raise EnvironmentLimit(reason)
    findings = run_detectors(ev, detectors, review=lambda found: review(op, case, ev.first, found, ctx))
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
