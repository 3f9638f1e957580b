"""A task: one case for one implementation, as plain picklable data.

Tasks cross process boundaries (spawned workers), so they carry the spec as a
dict and the implementation as its ``--impl`` reference, resolved again in the
worker. ``execute`` is the same function in-process and in a worker.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass
from typing import Any

from mlafuzz.generators.case import case_id_for
from mlafuzz.generators.spec import spec_from_dict, spec_to_json
from mlafuzz.harness.findings import Finding, Kind


@dataclass(frozen=True, kw_only=True)
class Task:
    index: int
    op: str
    seed: int
    spec: dict[str, Any]  # spec_to_dict form
    impl_ref: str
    device: str
    ulp: int = 0
    rerun: bool = False
    contract: str | None = None  # an invalid-input class to check as well
    rejects: tuple[str, ...] | None = None  # a weaker contract given on the command line
    slow_oracle: bool = False

    @property
    def case_id(self) -> str:
        spec = spec_from_dict(self.spec)
        return case_id_for(op=self.op, seed=self.seed, spec_json=spec_to_json(spec))


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None
    seconds: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"findings": [f.to_json() for f in self.findings], "skipped": self.skipped, "seconds": self.seconds}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> "TaskResult":
        return cls(findings=tuple(Finding.from_json(f) for f in data["findings"]), skipped=data["skipped"],
                   seconds=data["seconds"])


_ENTRIES: dict[tuple[str, str, tuple[str, ...] | None], Any] = {}


def _entry(task: Task):
    from mlafuzz.kernels.registry import resolve

    key = (task.op, task.impl_ref, task.rejects)
    if key not in _ENTRIES:
        _ENTRIES[key] = resolve(task.op, task.impl_ref, rejects=task.rejects)
    return _ENTRIES[key]


def execute(task: Task) -> TaskResult:
    """Run one task here and now. Harness errors become a finding, never an exception."""
    from mlafuzz.generators.invalid import INVALID_CLASSES
    from mlafuzz.generators.materialize import materialize
    from mlafuzz.harness.compare import Policy
    from mlafuzz.harness.contracts import check_contract
    from mlafuzz.harness.runner import run_case

    start = time.perf_counter()
    try:
        entry = _entry(task)
        spec = spec_from_dict(task.spec)
        case = materialize(spec, task.seed, task.device)
        result = run_case(case=case, entry=entry, policy=Policy(ulp=task.ulp), rerun=task.rerun,
                          slow_oracle=task.slow_oracle)
        findings = list(result.findings)
        if task.contract and not result.skipped:
            klass = next(k for k in INVALID_CLASSES[task.op] if k.name == task.contract)
            extra = check_contract(case=case, entry=entry, fn=entry.load(task.device), klass=klass)
            findings += [dataclasses.replace(f, seed=task.seed, spec=task.spec) for f in extra]
        return TaskResult(findings=tuple(findings), skipped=result.skipped, seconds=time.perf_counter() - start)
    except Exception as exc:  # our bug, not the impl's: make it loud and keep the run going
        tb = traceback.format_exc(limit=6).strip().splitlines()
        return TaskResult(findings=(Finding(
            kind=Kind.CRASH, op=task.op, impl=task.impl_ref, case_id=task.case_id, cause="harness_error",
            seed=task.seed, spec=task.spec,
            message=f"harness error (not the implementation's fault): {type(exc).__name__}: {exc}",
            extra={"traceback": tb}),), seconds=time.perf_counter() - start)
