"""Run one case through one implementation and its oracle, inside guards."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.compare import Context, Policy, compare
from mlafuzz.harness.findings import Finding, Kind
from mlafuzz.harness.ops import OP_DEFS
from mlafuzz.kernels.registry import ImplEntry


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    case_id: str
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None  # why the case was not run (a capability the impl lacks)
    seconds: float = 0.0


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _input_mutations(case: Case, inputs: dict, ctx: Context) -> list[Finding]:
    out = []
    for name, before in case.tensors.items():
        after = inputs.get(name)
        if before is None or after is None:
            continue
        if not torch.equal(before.reshape(-1).view(torch.uint8) if before.dtype.is_floating_point else before,
                           after.reshape(-1).view(torch.uint8) if after.dtype.is_floating_point else after):
            out.append(Finding(kind=Kind.INPUT_MUTATION, op=ctx.op, impl=ctx.impl, case_id=ctx.case_id,
                               tensor=name, cause=f"{name}:mutated",
                               message=f"input {name} changed during the call"))
    return out


def run_case(*, case: Case, entry: ImplEntry, policy: Policy = Policy(),
             fn: Callable | None = None) -> CaseResult:
    """Findings of one implementation on one case (empty tuple: it agreed with the oracle)."""
    start = time.perf_counter()
    opdef = OP_DEFS[case.op]
    missing = opdef.needs(case) - entry.capabilities
    if missing:
        return CaseResult(case_id=case.case_id, skipped=f"impl lacks capability: {', '.join(sorted(missing))}")
    fn = fn if fn is not None else entry.load(case.device)
    ctx = Context(op=case.op, impl=entry.name, case_id=case.case_id)
    inputs = case.cloned_tensors()
    findings: list[Finding] = []
    try:
        actual = opdef.invoke(fn, case, inputs)
        _sync(case.device)
    except Exception as exc:  # the impl refused or failed on a valid case: a finding, not a harness crash
        findings.append(Finding(kind=Kind.EXCEPTION, op=case.op, impl=entry.name, case_id=case.case_id,
                                cause=type(exc).__name__,
                                message=f"raised on a valid input: {_first_line(exc)}"))
    else:
        expected = opdef.oracle(case)
        findings.extend(compare(expected=expected, actual=actual, policy=policy, ctx=ctx))
    findings.extend(_input_mutations(case, inputs, ctx))
    spec = spec_to_dict(case.spec)
    findings = [dataclasses.replace(f, seed=case.seed, spec=spec) for f in findings]
    return CaseResult(case_id=case.case_id, findings=tuple(findings), seconds=time.perf_counter() - start)
