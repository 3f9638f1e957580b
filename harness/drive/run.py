"""Run one case through one implementation: the GPU fast path where it can judge, else the full path.

Two paths, the same findings (harness/fast/path.py, harness/check/full.py).
Should the full path find nothing where the fast path saw something, what the
fast path saw happened in one run only: NONDETERMINISM. The fast room is
optional: without triton, on the CPU, or with ``MLAFUZZ_FAST=0``, every case
takes the full path.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.check.compare import Context, Policy
from mlafuzz.harness.check.full import full_path
from mlafuzz.harness.check.interpreter import EnvironmentLimit
from mlafuzz.harness.check.linked import fold_linked
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import Op
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.reports.findings import Finding, Kind, Severity

FAST_SWITCH = "MLAFUZZ_FAST"  # "0": the fast path is off (the detector suite runs without it too)


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    case: Case
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None  # why the case was not judged (a capability the impl lacks, an environment limit)
    seconds: float = 0.0

    @property
    def case_id(self) -> str:
        return self.case.case_id  # made on demand: a clean case never needs it


def fast_room() -> ModuleType | None:
    """The fast path (harness/fast/path.py), or None where it cannot be imported (no triton, or the
    room deleted): then every case takes the full path."""
    if os.environ.get(FAST_SWITCH) == "0":
        return None
    try:
        from mlafuzz.harness.fast import path
    except ImportError:
        return None
    return path


def fast_resources(session: Session) -> Any:
    """The session's fast-path resources, made on first use (None: no fast path here)."""
    if session.fast is None:
        room = fast_room()
        if room is None:
            return None
        from mlafuzz.harness.fast.state import Resources

        session.fast = Resources()
    return session.fast


def check_call(
    *,
    session: Session,
    op: Op,
    case: Case,
    entry: ImplEntry,
    fn: Callable,
    policy: Policy,
    rerun: bool,
    oracle: Callable[[Case], Mapping[str, Any]] | None = None,
    fast: bool | None = None,
    wait: bool = False,
) -> list[Finding]:
    """Findings of one case. ``fast``: take the fast path where the op has one (default: on the GPU
    only; under Triton's CPU interpreter it is slower than the oracle); an explicit ``oracle``
    always takes the full path."""
    ctx = Context(op=op.name, impl=entry.name, case_id=lambda: case.case_id)
    sub = session.sub(case.device)
    if fast is None:
        fast = case.device.startswith("cuda")
    room = fast_room() if fast else None
    seen = ""
    # The fused checks are bit-exact: with a ulp tolerance the comparator judges every case (a
    # fused "differs" the full path then accepts would read as nondeterminism).
    key = (op.name, entry.name)
    res = fast_resources(session) if room is not None else None
    if room is not None and room.handles(op) and oracle is None and policy.ulp == 0 and res.worth_trying(key):
        result = room.fast_path(
            op=op,
            case=case,
            fn=fn,
            ctx=ctx,
            rerun=rerun,
            sub=sub,
            res=res,
            redzone=session.redzone,
            wait=wait,
        )
        seen = getattr(result, "seen", "")  # a Clear has seen nothing
        res.note(
            key,
            ran=not isinstance(result, room.Undecided) or result.ran,
            wasted=isinstance(result, room.Undecided) and result.ran and not seen,
        )
        # Clear: every step the fast path covers passed. A step it does not cover (check/pipeline.py)
        # must still run: the case goes down the full path, which runs every step.
        if isinstance(result, room.Clear) and not room.uncovered(op, session.detectors):
            return []
        if isinstance(result, room.Found):
            return fold_linked(op.linked, list(result.findings))
    findings = full_path(
        op=op,
        case=case,
        fn=fn,
        ctx=ctx,
        policy=policy,
        rerun=rerun,
        sub=sub,
        oracle=oracle,
        redzone=session.redzone,
        detectors=session.detectors,
    )
    findings = fold_linked(op.linked, findings)
    if seen and not any(f.severity is Severity.ERROR for f in findings):
        findings.append(
            ctx.finding(
                None,
                "not_reproduced",
                kind=Kind.NONDETERMINISM,
                message=f"the implementation {seen} in one check of this case; the full "
                "check's runs right after did not reproduce it: the result changes "
                "from run to run",
            )
        )
    return findings


def run_case(
    *,
    session: Session,
    case: Case,
    entry: ImplEntry,
    policy: Policy = Policy(),
    fn: Callable | None = None,
    rerun: bool = False,
    slow_oracle: bool = False,
    fast: bool | None = None,
) -> CaseResult:
    """Findings of one implementation on one case (empty tuple: it agreed with the oracle)."""
    start = time.perf_counter()
    op = session.table.get(case.op)
    missing = op.needs(case) - entry.capabilities
    if missing:
        return CaseResult(case=case, skipped=f"impl lacks capability: {', '.join(sorted(missing))}")
    revision = case.params.get("revision")  # set by drive/tasks.py execute
    if revision is None:  # a bare case (a test's, bench's): judged as a run under the newest would judge it
        revision = entry.judged_under(NEWEST_REVISION)
        case = dataclasses.replace(case, params={**case.params, "revision": revision})
    fn = fn if fn is not None else session.load(entry, case.device, revision=revision)
    try:
        findings = check_call(
            session=session,
            op=op,
            case=case,
            entry=entry,
            fn=fn,
            policy=policy,
            rerun=rerun,
            oracle=op.oracle_slow if slow_oracle else None,
            fast=fast,
        )
    except EnvironmentLimit as limit:  # Triton's interpreter failed, not the implementation
        return CaseResult(case=case, skipped=limit.reason, seconds=time.perf_counter() - start)
    if findings:  # the spec as a dict only when a finding carries it (thousands of calls at realistic sizes)
        spec = spec_to_dict(case.spec)
        findings = [dataclasses.replace(f, seed=case.seed, spec=spec, revision=revision) for f in findings]
    return CaseResult(case=case, findings=tuple(findings), seconds=time.perf_counter() - start)
