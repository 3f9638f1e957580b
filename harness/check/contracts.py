"""Contract checks: an implementation must refuse the invalid inputs it promises to refuse.

For a promised class the call must raise (any exception) and leave every
output and input byte as it was; running instead is ACCEPTED_INVALID_INPUT.
A class that is not memory-safe must be refused before any kernel is launched
(SPEC 3): a raise out of the launch itself is ACCEPTED_INVALID_INPUT too, since
the launch may have written past buffers no guard watches (ones the
implementation allocated itself), and the worker that ran it is replaced
(harness/drive/workers/crash.py).
A class outside the contract that runs is reported at INFO severity: worth
knowing, never failing the run.
"""

from __future__ import annotations

from typing import Callable

from mlafuzz.generators.case import Case
from mlafuzz.generators.invalid import InvalidClass
from mlafuzz.harness.check.calls import call_copied, first_line, raised_in_launch
from mlafuzz.harness.check.compare import Context
from mlafuzz.harness.check.detectors import input_mutations, launch_error_findings, redzone_findings
from mlafuzz.harness.memory.guards import PATTERNS
from mlafuzz.harness.memory.redzone import RedZone
from mlafuzz.harness.ops.op import Op
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.reports.findings import Finding, Kind, Severity


def check_contract(
    *,
    op: Op,
    case: Case,
    entry: ImplEntry,
    fn: Callable,
    klass: InvalidClass,
    ctx: Context,
    sub: Callable[[str], Callable],
    redzone: RedZone | None = None,
) -> list[Finding]:
    invalid = klass.make(case)
    if invalid is None:
        return []
    promised = klass.name in entry.rejects
    if not promised and not klass.memory_safe:
        return []  # running it could corrupt this process; nothing was promised anyway
    call = call_copied(op=op, fn=fn, case=invalid, fill=PATTERNS[0], sub=sub, redzone=redzone)
    cause, extra = f"contract:{klass.name}", {"invalid_class": klass.name}
    pending = launch_error_findings(call, ctx)
    if not promised:
        if call.error is None:
            return [
                ctx.finding(
                    None,
                    cause,
                    kind=Kind.ACCEPTED_INVALID_INPUT,
                    severity=Severity.INFO,
                    extra=extra,
                    message=f"ran an input outside its contract ({klass.name}: {klass.description})",
                )
            ] + pending
        return pending
    if call.error is None:
        return (
            [
                ctx.finding(
                    None,
                    cause,
                    kind=Kind.ACCEPTED_INVALID_INPUT,
                    extra=extra,
                    message=f"accepted {klass.name} ({klass.description}) instead of raising",
                )
            ]
            + redzone_findings(call, ctx)
            + pending
        )
    launch = None if klass.memory_safe else raised_in_launch(call.error)
    if launch is not None:
        return [
            ctx.finding(
                None,
                cause,
                kind=Kind.ACCEPTED_INVALID_INPUT,
                extra=extra,
                message=f"raised on {klass.name} ({first_line(call.error)}) only out of its kernel's launch "
                f"({launch}), not before launching: the launch may have written out of bounds",
            )
        ] + pending
    touched = []
    for name, g in call.guards.items():
        changed = int((g.full != g.fill).sum())
        if changed:
            touched.append(f"{name} ({changed} bytes)")
    touched += [f.tensor or "" for f in input_mutations(invalid, call.inputs, ctx, inplace=op.inplace)]
    if touched:
        return [
            ctx.finding(
                None,
                cause,
                kind=Kind.ACCEPTED_INVALID_INPUT,
                extra=extra,
                message=f"raised on {klass.name} ({first_line(call.error)}) but only after writing "
                f"{', '.join(touched)}",
            )
        ] + pending
    return pending
