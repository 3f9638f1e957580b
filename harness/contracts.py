"""Contract checks: an implementation must refuse the invalid inputs it promises to refuse.

For a promised class the call must raise (any exception) and leave every
output and input byte as it was; running instead is ACCEPTED_INVALID_INPUT.
A class outside the contract that runs is reported at INFO severity: worth
knowing, never failing the run.
"""

from __future__ import annotations

from typing import Callable

from mlafuzz.generators.case import Case
from mlafuzz.generators.invalid import INVALID_CLASSES, InvalidClass
from mlafuzz.harness.compare import Context
from mlafuzz.harness.findings import Finding, Kind, Severity
from mlafuzz.harness.guards import PATTERNS
from mlafuzz.harness.ops import OP_DEFS
from mlafuzz.harness.runner import call_impl, first_line, input_mutations, redzone_findings
from mlafuzz.kernels.registry import ImplEntry


def classes_for(op: str) -> tuple[InvalidClass, ...]:
    return INVALID_CLASSES.get(op, ())


def check_contract(*, case: Case, entry: ImplEntry, fn: Callable, klass: InvalidClass) -> list[Finding]:
    invalid = klass.make(case)
    if invalid is None:
        return []
    promised = klass.name in entry.rejects
    if not promised and not klass.memory_safe:
        return []  # running it could corrupt this process; nothing was promised anyway
    opdef = OP_DEFS[case.op]
    call = call_impl(opdef=opdef, fn=fn, case=invalid, fill=PATTERNS[0])
    ctx = Context(op=case.op, impl=entry.name, case_id=case.case_id)
    base = dict(op=case.op, impl=entry.name, case_id=case.case_id, cause=f"contract:{klass.name}",
                extra={"invalid_class": klass.name})
    if not promised:
        if call.error is None:
            return [Finding(kind=Kind.ACCEPTED_INVALID_INPUT, severity=Severity.INFO, **base,
                            message=f"ran an input outside its contract ({klass.name}: {klass.description})")]
        return []
    if call.error is None:
        return [Finding(kind=Kind.ACCEPTED_INVALID_INPUT, **base,
                        message=f"accepted {klass.name} ({klass.description}) instead of raising")
                ] + redzone_findings(call, ctx)
    touched = []
    for name, g in call.guards.items():
        changed = int((g.full != g.fill).sum())
        if changed:
            touched.append(f"{name} ({changed} bytes)")
    touched += [f.tensor or "" for f in input_mutations(invalid, call.inputs, ctx)]
    if touched:
        return [Finding(kind=Kind.ACCEPTED_INVALID_INPUT, **base,
                        message=f"raised on {klass.name} ({first_line(call.error)}) but only after writing "
                                f"{', '.join(touched)}")]
    return []

