"""What tests share to reach the harness the way a worker does: the op table, one session per
test process, and thin wrappers that fill in the session."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from hypothesis import strategies as st

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import SMALL, Knobs, cases_strategy, draw_with_seed
from mlafuzz.generators.draw import specs as _specs
from mlafuzz.harness.check.compare import Context, Policy
from mlafuzz.harness.check.contracts import check_contract as _check_contract
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.run import CaseResult
from mlafuzz.harness.drive.run import run_case as _run_case
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.reports.findings import Finding

if TYPE_CHECKING:
    from mlafuzz.harness.drive.mutants import MutantResult

INVALID_CLASSES = {op.name: op.invalid for op in OPS.ops}
# triton is an optional extra: tests of Triton code skip without it (tests/test_collection.py holds them to that)
HAS_TRITON = importlib.util.find_spec("triton") is not None


@functools.cache
def session() -> Session:
    """This test process's session (implementations loaded once, as in a worker)."""
    return Session(table=OPS)


def materialize(spec: Any, seed: int, device: str = "cpu") -> Case:
    return OPS.materialize(spec, seed, device)


def cpu_mutants(
    *ops: str,
    cases: int | None,
    out: Path,
    budget: float | None = None,
    in_session: Session | None = None,
    **more: Any,
) -> tuple[list[MutantResult], list[str]]:
    """``run_mutants`` as a test runs a catalog: the mutants of ``ops``, ``cases`` cases each (and
    ``budget`` seconds, if given), on the CPU in this process (``in_session``, else this process's
    session), seed 0, no shrinking; ``more`` goes to ``run_mutants`` as is."""
    from mlafuzz.harness.drive.mutants import run_mutants  # the mutants driver, only where a test runs it
    from mlafuzz.harness.drive.workers import InProcess

    s = in_session or session()
    return run_mutants(
        session=s,
        ops=list(ops),
        device="cpu",
        budget=budget,
        cases=cases,
        out=out,
        seed=0,
        shrink_budget=0.0,
        executor=InProcess(session=s),
        **more,
    )


def draw_spec(op: str, *, seed: int, knobs: Knobs = SMALL) -> Any:
    return draw_with_seed(OPS.get(op).draw, seed=seed, knobs=knobs)


def specs(op: str, knobs: Knobs = SMALL) -> st.SearchStrategy[Any]:
    return _specs(OPS.get(op).draw, knobs)


def cases(op: str, knobs: Knobs = SMALL) -> st.SearchStrategy[tuple[Any, int]]:
    return cases_strategy(OPS.get(op).draw, knobs)


def features(spec: Any) -> set[str]:
    return OPS.get(spec.op).features(spec)


def resolve(op: str, ref: str, *, rejects: Any = None) -> ImplEntry:
    return session().entry(op, ref, rejects=rejects)


def run_case(
    *,
    case: Case,
    entry: ImplEntry,
    policy: Policy = Policy(),
    fn: Callable | None = None,
    rerun: bool = False,
    slow_oracle: bool = False,
    fast: bool | None = None,
    in_session: Session | None = None,
) -> CaseResult:
    return _run_case(
        session=in_session or session(),
        case=case,
        entry=entry,
        policy=policy,
        fn=fn,
        rerun=rerun,
        slow_oracle=slow_oracle,
        fast=fast,
    )


def fast_verdict(case: Case, impl: str, *, rerun: bool = False, fn: Callable | None = None) -> Any:
    """The GPU fast path's own verdict (harness/fast/path.py: Clear, Undecided or Found) on ``case``
    for ``impl`` of its op, in a fresh session (``run_case`` would go on to the full path); ``fn``
    instead of loading ``impl``. The fast path's modules load only here: they need triton."""
    from mlafuzz.harness.drive.run import fast_resources
    from mlafuzz.harness.fast.path import fast_path

    s = session()
    return fast_path(
        op=OPS.get(case.op),
        case=case,
        fn=fn if fn is not None else s.load(resolve(case.op, impl), case.device),
        ctx=Context(op=case.op, impl=impl, case_id=case.case_id),
        rerun=rerun,
        sub=s.sub(case.device),
        res=fast_resources(s),
    )


def fast_path_hides_nothing(entry: ImplEntry, cases: Iterable[Case], *, enough: int | None = None) -> int:
    """The fast path's promise for a planted bug, case by case: where the full path finds the bug,
    the fast path's verdict (every other one with a re-run) is never Clear, and a run that starts on
    the fast path still names the bug's kind. Returns how many cases showed the bug (it stops at
    ``enough``)."""
    from mlafuzz.harness.fast.path import Clear

    shown = 0
    for case in cases:
        judged = run_case(case=case, entry=entry, fast=False)
        assert judged.skipped is None, (case.case_id, judged.skipped)
        if not judged.findings:
            continue
        verdict = fast_verdict(case, entry.name, rerun=shown % 2 == 0)
        assert not isinstance(verdict, Clear), (case.case_id, judged.findings)
        found = run_case(case=case, entry=entry, fast=True).findings
        assert entry.expected_kind in {f.kind.value for f in found}, (case.case_id, found)
        shown += 1
        if shown == enough:
            break
    return shown


def session_with(op: str, **changes: Any) -> Session:
    """A fresh session whose op table has ``op``'s row changed (e.g. ``oracle=`` one that must not run)."""
    import dataclasses

    from mlafuzz.generators.generator import Generator
    from mlafuzz.harness.ops.op import OpTable

    # A change of a generator's part (``materialize=``) goes to the row's generator record.
    parts = {f.name for f in dataclasses.fields(Generator)}
    gen = {k: v for k, v in changes.items() if k in parts}
    row = {k: v for k, v in changes.items() if k not in parts}

    def changed(o: Any) -> Any:
        return dataclasses.replace(o, generator=dataclasses.replace(o.generator, **gen), **row)

    return Session(table=OpTable(tuple(changed(o) if o.name == op else o for o in OPS.ops)))


def check_contract(*, case: Case, entry: ImplEntry, fn: Callable, klass: Any) -> list[Finding]:
    s = session()
    return _check_contract(
        op=OPS.get(case.op),
        case=case,
        entry=entry,
        fn=fn,
        klass=klass,
        ctx=Context(op=case.op, impl=entry.name, case_id=case.case_id),
        sub=s.sub(case.device),
        redzone=s.redzone,
    )


def spec_from_json(text: str) -> Any:
    from mlafuzz.generators.spec import spec_from_json as decode

    return decode(text, types=OPS.spec_types)


def spec_from_dict(data: Any) -> Any:
    return OPS.decode(data)


def matches(flag: Any) -> bool:
    """What a fused check's flag says (harness/fast): True when it judged the outputs the oracle's
    (a flag of zeros), False when they differ or it could not tell (None, or 2: not handled)."""
    return flag is not None and int(flag.max()) == 0


def report_of(run_dir: Any, *, ledger: Any = None) -> Any:
    """A run directory read and judged as ``mlafuzz report`` does (harness verdict, reports view):
    under ``ledger`` (a loaded one), else the one the run recorded."""
    from pathlib import Path

    from mlafuzz.harness.ledger import judge, ledger_of_run
    from mlafuzz.reports.model import build_report, load_run

    view = load_run(Path(run_dir))
    ledger = ledger if ledger is not None else ledger_of_run(dict(view.run), where=str(run_dir))
    return build_report(view, judge(view.findings, ledger=ledger, ran=view.pairs()))


def render_dir(run_dir: Any, fmt: str, *, ledger: Any = None) -> str:
    from mlafuzz.reports.formats.render import render

    return render(report_of(run_dir, ledger=ledger), fmt)
