"""A task: one case for one implementation, as plain picklable data, and ``execute``.

Tasks cross process boundaries (spawned workers), so they carry the
implementation as its ``--impl`` reference (resolved once per worker by its
session) and the spec either as its dict (shrinking, replay, ``--spec``) or
not at all: then the worker draws it from (op, seed, knobs), as the parent
would, so a run's parent never builds or decodes a spec per case.
``execute`` is the same function in-process and in a worker.

Two things a case takes from its implementation, settled in ``execute``:

- its contract revision (SPEC section 7): the entry's pin, else the run's
  (``Task.revision``, default the newest). It goes into the case's params, so
  the op's oracle, the fused checks and the call (an entry that follows
  revisions is loaded bound to it) all see the same one, and every finding
  records it;
- a drawn spec's optional features: the op row's ``fit`` leaves out what the
  implementation lacks (convert's block stride and compaction, drawn for all),
  so no drawn case is wasted on a skip. A spec given whole (``--spec``,
  shrinking, replay) is never changed: a capability it needs and the
  implementation lacks makes the case a counted skip (``Op.needs``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, ContextManager

from mlafuzz.generators.case import case_id_for
from mlafuzz.generators.draw import SMALL, Knobs
from mlafuzz.generators.spec import spec_to_dict, spec_to_json
from mlafuzz.harness.check.compare import Context, Policy
from mlafuzz.harness.check.contracts import check_contract
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.run import run_case
from mlafuzz.harness.memory.cuda_errors import is_out_of_memory, looks_like_cuda_error
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.reports.findings import Finding, Kind


@dataclass(frozen=True, kw_only=True)
class Task:
    index: int
    op: str
    seed: int
    impl_ref: str
    device: str
    spec: dict[str, Any] | None = None  # spec_to_dict form; None: drawn from (op, seed, knobs)
    knobs: Knobs = SMALL
    ulp: int = 0
    rerun: bool = False
    contract: str | None = None  # an invalid-input class to check as well
    rejects: tuple[str, ...] | None = None  # a weaker contract given on the command line
    declared: tuple[str, ...] = ()  # optional surfaces the user declared the implementation takes (--features)
    slow_oracle: bool = False
    revision: str | None = None  # the run's contract revision (None: the newest); an entry's pin wins

    def resolve(self, table: OpTable) -> Resolved:
        """The task's spec, decoded or drawn from its seed once, with what is derived from it."""
        spec = (
            table.decode(self.spec)
            if self.spec is not None
            else table.draw_spec(self.op, seed=self.seed, knobs=self.knobs)
        )
        return Resolved(task=self, spec=spec)

    def spec_obj(self, table: OpTable) -> Any:
        """The task's spec (decoded, or drawn from its seed)."""
        return self.resolve(table).spec

    def with_spec(self, table: OpTable) -> Task:
        """This task with its spec written out (for bundles, shrinking, findings of a lost worker)."""
        return self.resolve(table).described

    def case_id(self, table: OpTable) -> str:
        return self.resolve(table).case_id


@dataclass(frozen=True)
class Resolved:
    """A task with its spec resolved (decoded, or drawn from its seed) once, carried where it is
    needed, and what is derived from it made on first use. It stays in the process that resolved
    it: the task alone crosses to workers (small on the wire: they draw from the seed)."""

    task: Task
    spec: Any

    @cached_property
    def spec_dict(self) -> dict[str, Any]:
        return self.task.spec if self.task.spec is not None else spec_to_dict(self.spec)

    @cached_property
    def described(self) -> Task:
        """The task with its spec written out."""
        return self.task if self.task.spec is not None else dataclasses.replace(self.task, spec=self.spec_dict)

    @cached_property
    def case_id(self) -> str:
        return case_id_for(op=self.task.op, seed=self.task.seed, spec_json=spec_to_json(self.spec))

    def context(self, *, revision: str | None = None) -> Context:
        """Whose findings a harness-level event of this case makes (a lost worker, a crash)."""
        t = self.task
        return Context(
            op=t.op, impl=t.impl_ref, case_id=self.case_id, seed=t.seed, spec=self.spec_dict, revision=revision
        )


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None
    seconds: float = 0.0
    features: tuple[str, ...] = ()  # the case's features (coverage), computed where its spec was
    spec: dict[str, Any] | None = None  # the spec as drawn, when a finding needs it

    def to_wire(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.findings],
            "skipped": self.skipped,
            "seconds": self.seconds,
            "features": list(self.features),
            "spec": self.spec,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> TaskResult:
        return cls(
            findings=tuple(Finding.from_json(f) for f in data["findings"]),
            skipped=data["skipped"],
            seconds=data["seconds"],
            features=tuple(data.get("features") or ()),
            spec=data.get("spec"),
        )


# Causes of the findings ``execute`` makes of an exception that escaped a case (workers and the
# fuzz loop read them back: a broken CUDA context explains both, and harness errors are not shrunk).
HARNESS_ERROR = "harness_error"  # no implementation call in flight: the harness's own bug
AFTER_CALL = "cuda_error_after_call"  # a CUDA error of the implementation's call, met in a harness op


def execute(
    task: Task,
    session: Session,
    *,
    on_phase: Callable[[str], None] | None = None,
    hold: Callable[[Any], ContextManager[None]] | None = None,
) -> TaskResult:
    """Run one task here and now. Harness errors become a finding, never an exception.
    ``on_phase`` hears "valid" before the case and "contract:<class>" before its error input (a
    worker publishes them, so a crash is charged to the part that caused it). ``hold(spec)`` is
    held from making the case to its verdict (a worker's share of its GPU: memory/share.py)."""
    start = time.perf_counter()
    called = False  # whether an implementation's call has been made (a CUDA error after it is its own)
    revision = task.revision
    resolved: Resolved | None = None
    try:
        table = session.table
        op = table.get(task.op)
        entry = session.entry(task.op, task.impl_ref, rejects=task.rejects, features=task.declared)
        revision = entry.judged_under(task.revision or NEWEST_REVISION)
        if not entry.follows(revision):
            return TaskResult(
                skipped=f"impl does not follow contract revision {revision}", seconds=time.perf_counter() - start
            )
        resolved = task.resolve(table)
        spec = resolved.spec
        if task.spec is None and op.fit is not None:
            spec = op.fit(spec, entry.capabilities)
        with hold(spec) if hold is not None else contextlib.nullcontext():
            features = tuple(sorted(op.features(spec)))
            case = op.materialize(spec, seed=task.seed, device=task.device)
            case = dataclasses.replace(case, params={**case.params, "revision": revision})
            if on_phase is not None:
                on_phase("valid")
            called = True
            result = run_case(
                session=session,
                case=case,
                entry=entry,
                policy=Policy(ulp=task.ulp),
                rerun=task.rerun,
                slow_oracle=task.slow_oracle,
            )
            findings = list(result.findings)
            if task.contract and not result.skipped:
                if on_phase is not None:
                    on_phase(f"contract:{task.contract}")
                extra = check_contract(
                    op=op,
                    case=case,
                    entry=entry,
                    fn=session.load(entry, task.device, revision=revision),
                    klass=op.invalid_class(task.contract),
                    sub=session.sub(task.device),
                    ctx=Context(op=op.name, impl=entry.name, case_id=lambda: case.case_id),
                    redzone=session.redzone,
                )
                if extra:  # the spec as a dict only for a finding that carries it
                    spec_dict = spec_to_dict(spec)
                    findings += [
                        dataclasses.replace(f, seed=task.seed, spec=spec_dict, revision=revision) for f in extra
                    ]
            return TaskResult(
                findings=tuple(findings),
                skipped=result.skipped,
                seconds=time.perf_counter() - start,
                features=features,
                spec=spec_to_dict(spec) if findings and task.spec is None else None,
            )
    except Exception as exc:
        if not called and is_out_of_memory(exc):
            # The harness could not make this case on a GPU that other processes fill: a counted
            # skip, never a finding against anyone.
            return TaskResult(
                skipped=f"out of GPU memory making the case ({str(exc).splitlines()[0][:80]})",
                seconds=time.perf_counter() - start,
            )
        return TaskResult(
            findings=(_unexpected(task, resolved, session, exc, called=called, revision=revision),),
            seconds=time.perf_counter() - start,
        )


def _unexpected(
    task: Task, resolved: Resolved | None, session: Session, exc: Exception, *, called: bool, revision: str | None
) -> Finding:
    """The finding for an exception that escaped a case. A CUDA error after an implementation's
    call is that call's (a pending launch error or a fault it caused surfacing in a harness op);
    anything else with no call in flight is the harness's own bug: loud, and the run goes on.
    ``resolved``: the task's spec as ``execute`` resolved it (None: it escaped before)."""
    tb = traceback.format_exc(limit=6).strip().splitlines()
    try:
        ctx = (resolved or task.resolve(session.table)).context(revision=revision)
    except Exception:
        ctx = Context(
            op=task.op,
            impl=task.impl_ref,
            case_id=f"{task.op}-{task.seed}",
            seed=task.seed,
            spec=task.spec,
            revision=revision,
        )
    if called and looks_like_cuda_error(exc):
        return ctx.finding(
            None,
            AFTER_CALL,
            kind=Kind.LAUNCH_ERROR,
            message=f"a CUDA error surfaced after the implementation's call, in the harness's next "
            f"CUDA operation: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}",
            extra={"traceback": tb},
        )
    return ctx.finding(
        None,
        HARNESS_ERROR,
        kind=Kind.CRASH,
        message=f"harness error (not the implementation's fault): {type(exc).__name__}: {exc}",
        extra={"traceback": tb},
    )
