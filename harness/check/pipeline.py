"""The detector pipeline: every check of a case's calls as a named step, run in order.

The full path (full.py) makes the calls and gathers what they left (an
``Evidence``); each ``Detector`` reads it and returns its findings. The list is
data: a session runs ``Session.detectors`` (default ``DETECTORS``), and a test
or a new check adds a step to it rather than a call inside full.py.

The GPU fast path (harness/fast) judges a case without these steps, so it
declares, per op, the step names its fused checks reproduce
(``fast.path.covers``). After a fast ``Clear``, a case whose session runs a step
the fast path does not cover goes down the full path as well, which runs every
step (drive/run.py): never a step silently skipped on the GPU, and no cost while
every step is covered. The check room cannot say which steps the fast path covers
(the fast room sits above it and is optional); the fast room says so itself.

Order is behaviour: findings come out in step order; the op's ``review`` (the step
op's metadata re-filing) sees the findings of the ``reviewed`` steps only, which
come first, before any other step runs; one cause, one finding
(``fold_misplaced`` in full.py) runs over the lot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.harness.check.calls import Call, first_line, own_traceback
from mlafuzz.harness.check.compare import Policy, compare
from mlafuzz.harness.check.detectors import launch_error_findings, redzone_findings, rerun_differs
from mlafuzz.harness.check.narrow import narrowed_names
from mlafuzz.harness.check.stages import stage
from mlafuzz.harness.memory.guards import oob_findings, write_map_findings
from mlafuzz.harness.ops.op import Op
from mlafuzz.reports.findings import Context, Finding, Kind


@dataclass(kw_only=True)
class Evidence:
    """What a case's calls left, for the detectors: per-case state that dies with the check.

    ``first``: the call held to the oracle; ``second``: the re-run over the other fill (None when
    none was made); ``mutated``: the first call's input mutations (read before the re-run, which
    reuses unchanged inputs); ``head``: writes into in-place outputs' zero blocks (check/narrow.py);
    ``unwritten``: the write map's never-written elements per guarded output; ``rewritten``: per
    guarded output, whether the two runs left its bytes different; ``prior``: the
    findings of the steps already run (a step that must not file a cause twice reads it)."""

    op: Op
    case: Case
    ctx: Context
    policy: Policy
    first: Call
    second: Call | None = None
    mutated: list[Finding] = field(default_factory=list)
    head: list[Finding] = field(default_factory=list)
    unwritten: dict[str, Any] = field(default_factory=dict)
    rewritten: dict[str, bool] = field(default_factory=dict)
    oracle: Callable[[Case], Mapping[str, Any]] | None = None
    prior: list[Finding] = field(default_factory=list)

    @property
    def returned(self) -> bool:
        """The first call returned, and left no CUDA error pending: its outputs can be judged."""
        return self.first.error is None and self.first.launch_error is None

    @cached_property
    def expected(self) -> Mapping[str, Any]:
        """The oracle's outputs, computed on first use (``oracle`` overrides the op's vectorized one)."""
        return (self.oracle or self.op.oracle)(self.case)

    @cached_property
    def row_sets(self) -> Mapping[str, Any]:
        """Outputs compared as row multisets (the op's ``row_sets``), with their rows' valid counts."""
        return self.op.row_sets(self.case, self.expected) if self.op.row_sets else {}


@dataclass(frozen=True, kw_only=True)
class Detector:
    """One named check. ``run`` returns its findings of one case (``[]`` where its evidence is
    absent: a re-run check with no re-run); ``kinds``: the finding kinds it can make; ``reviewed``:
    its findings pass through the op's ``review``; ``stage``: its profiler scope (check/stages.py)."""

    name: str
    run: Callable[[Evidence], list[Finding]]
    kinds: frozenset[Kind]
    reviewed: bool = False
    stage: str | None = None


def _exception(ev: Evidence) -> list[Finding]:
    if ev.first.error is None:
        return []
    return [
        ev.ctx.finding(
            None,
            type(ev.first.error).__name__,
            kind=Kind.EXCEPTION,
            message=f"raised on a valid input: {first_line(ev.first.error)}",
            extra={"traceback": own_traceback(ev.first.error)},  # its own frames, for triage
        )
    ]


def _compare(ev: Evidence) -> list[Finding]:
    if not ev.returned:
        return []
    return compare(
        expected=ev.expected,
        actual=ev.first.outputs,
        policy=ev.policy,
        ctx=ev.ctx,
        row_sets=ev.row_sets,
        skip=ev.unwritten,
        origin=narrowed_names(ev.op, ev.case),
        loose=ev.op.loose(ev.case) if ev.op.loose else None,
    )


def _guard_zones(ev: Evidence) -> list[Finding]:
    if not ev.returned:
        return []
    return [f for name, g in ev.first.guards.items() for f in oob_findings(name=name, g=g, ctx=ev.ctx)]


def _inputs(ev: Evidence) -> list[Finding]:
    # A call that raised is still held to its inputs; one that left a CUDA error pending without
    # raising is not looked at again (the context may not take another call as it should).
    return ev.mutated if ev.first.error is not None or ev.first.launch_error is None else []


def _rerun_raised(ev: Evidence) -> list[Finding]:
    if ev.second is None or ev.second.error is None:
        return []
    return [
        ev.ctx.finding(
            None,
            "rerun_raised",
            kind=Kind.NONDETERMINISM,
            message=f"a second run of the same case raised: {first_line(ev.second.error)}",
        )
    ]


def _write_map(ev: Evidence) -> list[Finding]:
    """Per guarded output of the re-run: its guard zones (a cause the first run filed is not filed
    again), then the two runs' write map."""
    if ev.second is None or ev.second.error is not None:
        return []
    out: list[Finding] = []
    for name, g in ev.second.guards.items():
        seen = {f.dedup_key for f in ev.prior + out}
        out += [f for f in oob_findings(name=name, g=g, ctx=ev.ctx) if f.dedup_key not in seen]
        out += write_map_findings(
            name=name, run_a=ev.first.guards[name], run_b=g, ctx=ev.ctx, differ=ev.rewritten.get(name)
        )
    return out


def _rerun_outputs(ev: Evidence) -> list[Finding]:
    if ev.second is None or ev.second.error is not None:
        return []
    return rerun_differs(ev.first, ev.second, ev.ctx, unordered=frozenset(ev.row_sets))


def _of(call: Callable[[Evidence], Call | None], detect: Callable[[Call, Context], list[Finding]]) -> Callable:
    def run(ev: Evidence) -> list[Finding]:
        c = call(ev)
        return detect(c, ev.ctx) if c is not None else []

    return run


_OUTPUT_KINDS = frozenset({Kind.VALUE_MISMATCH, Kind.NAN_MISMATCH, Kind.SUBNORMAL_FLUSH})

# Today's full path, step for step (the order is the order findings are reported in).
DETECTORS: tuple[Detector, ...] = (
    Detector(
        name="redzone", run=_of(lambda ev: ev.first, redzone_findings), kinds=frozenset({Kind.OOB_WRITE}), reviewed=True
    ),
    Detector(
        name="launch_error",
        run=_of(lambda ev: ev.first, launch_error_findings),
        kinds=frozenset({Kind.LAUNCH_ERROR}),
        reviewed=True,
    ),
    Detector(name="exception", run=_exception, kinds=frozenset({Kind.EXCEPTION}), reviewed=True),
    Detector(name="compare", run=_compare, kinds=_OUTPUT_KINDS, reviewed=True, stage="oracle"),
    Detector(
        name="zero_blocks",
        run=lambda ev: ev.head if ev.returned else [],
        kinds=frozenset({Kind.VALUE_MISMATCH}),
        reviewed=True,
    ),
    Detector(name="guard_zones", run=_guard_zones, kinds=frozenset({Kind.OOB_WRITE}), stage="guards"),
    Detector(name="input_mutation", run=_inputs, kinds=frozenset({Kind.INPUT_MUTATION})),
    Detector(
        name="rerun_launch_error",
        run=_of(lambda ev: ev.second, launch_error_findings),
        kinds=frozenset({Kind.LAUNCH_ERROR}),
    ),
    Detector(name="rerun_raised", run=_rerun_raised, kinds=frozenset({Kind.NONDETERMINISM})),
    Detector(
        name="write_map",
        run=_write_map,
        kinds=frozenset({Kind.OOB_WRITE, Kind.MISSING_WRITE, Kind.NONDETERMINISM}),
        stage="guards",
    ),
    Detector(name="rerun_outputs", run=_rerun_outputs, kinds=frozenset({Kind.NONDETERMINISM})),
)


def run_detectors(
    ev: Evidence, detectors: tuple[Detector, ...], *, review: Callable[[list[Finding]], list[Finding]]
) -> list[Finding]:
    """Every step's findings, in order. The ``reviewed`` steps come first; their findings pass
    through ``review`` before the first other step runs (skipped, as the full path always did, for a
    call that left a CUDA error pending without raising)."""
    found: list[Finding] = []
    reviewing = True
    for d in detectors:
        if reviewing and not d.reviewed:
            reviewing = False
            if ev.first.error is not None or ev.first.launch_error is None:
                found = review(found)
        elif d.reviewed and not reviewing:
            raise ValueError(f"detector {d.name!r} is reviewed but comes after a step that is not")
        ev.prior = found
        if d.stage is None:
            found = found + d.run(ev)
        else:
            with stage(d.stage):
                found = found + d.run(ev)
    if reviewing and (ev.first.error is not None or ev.first.launch_error is None):
        found = review(found)
    return found
