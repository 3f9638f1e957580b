"""Replaying a repro bundle's case: is its finding still there?

The bundle's inputs.pt must match what its spec and seed generate (else it was
tampered with, or written by another mlafuzz version). A CRASH or TIMEOUT case
runs in an isolated worker, under the run's own per-case limit (case.json's
``timeout``); any other in this process.

A bundle is data, and may come from anywhere (a CI artifact, a bug report), so
replay never imports code because a bundle names it: it runs a built-in
implementation (a registered name, or ``vllm`` from the installed package),
the one the user names with ``impl_ref`` (``--impl``), or, only with
``trust_bundle``, the external ``module:attr`` / ``path.py:attr`` the bundle
recorded. inputs.pt is read with ``weights_only=True`` for the same reason.

Also here: a folder of bundles as a regression suite (``bundle_dirs``), the
same folder as a fuzz run's corpus (``corpus_tasks``, ``CorpusFirst``), a
replay under the debugger (``debug``), and ``load_bundle_call``: a bundle's
case as one call of any function, for a user's own debugging session.
"""

from __future__ import annotations

import bdb
import collections
import dataclasses
import functools
import pdb
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.shrink import evaluate_sync, same_finding
from mlafuzz.harness.drive.tasks import Task
from mlafuzz.harness.drive.workers import Executor, InProcess, WorkerPool, drop_queued
from mlafuzz.harness.memory.bits import same_bits
from mlafuzz.harness.memory.guards import PATTERNS
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.kernels.entry import ImplEntry, ImplError
from mlafuzz.reports.bundle import Bundle, BundleError, read_bundle
from mlafuzz.reports.findings import Finding, Kind, Severity


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    bundle: Bundle
    impl_ref: str
    device: str
    found: tuple[tuple[Finding, bool], ...]  # each error finding, and whether it is the bundle's own
    revision: str | None = None  # the run revision it replayed under (an entry's pin still wins)

    @property
    def passed(self) -> bool:
        return not self.found


def check_inputs(bundle: Bundle, table: OpTable) -> None:
    """BundleError unless inputs.pt holds what the bundle's spec and seed generate (a cache with zero
    blocks: its blocks past them, ``Case.generated_tensors``)."""
    regenerated = table.materialize(table.decode(bundle.spec), bundle.seed, "cpu").generated_tensors()
    if set(regenerated) != set(bundle.inputs):
        raise BundleError(
            f"inputs.pt: holds tensors {sorted(bundle.inputs)}, case.json's spec and seed make"
            f" {sorted(regenerated)} (tampered, or written by another mlafuzz version)"
        )
    for name, stored in bundle.inputs.items():
        fresh = regenerated.get(name)
        if fresh is None or fresh.dtype != stored.dtype or fresh.shape != stored.shape or not same_bits(fresh, stored):
            raise BundleError(
                f"inputs.pt: tensor {name!r} does not match case.json's spec and seed"
                " (tampered, or written by another mlafuzz version)"
            )


DEFAULT_TIMEOUT = 120.0  # a bundle that recorded none (the fuzz command's default)


def replay(
    *,
    bundle_path: Path,
    impl_ref: str | None,
    device: str | None,
    table: OpTable,
    timeout: float | None = None,
    trust_bundle: bool = False,
    revision: str | None = None,
    debug: bool = False,
) -> ReplayResult:
    """Run the bundle's case again (see the module docstring); ``timeout`` overrides the bundle's;
    under its recorded contract revision unless ``revision`` says another (a bundle from before
    revisions replays under the newest). ``debug``: in this process whatever the finding's kind,
    stopping in pdb just before each call of the implementation (``s`` steps into it), and
    post-mortem where a call raises (``DebugSession``)."""
    bundle = read_bundle(bundle_path)
    revision = revision or bundle.revision
    check_inputs(bundle, table)  # data only: a tampered bundle is said so before anything else
    session = DebugSession(table=table, op=bundle.op) if debug else Session(table=table)
    if impl_ref is None and not trust_bundle and not session.registry.is_builtin(bundle.op, bundle.impl):
        raise ImplError(
            f"replay: {bundle.path} names an external implementation, {bundle.op}={bundle.impl}, and "
            f"replay imports no code on a bundle's word: name it yourself (--impl "
            f"{shlex.quote(f'{bundle.op}={bundle.impl}')}) or pass --trust-bundle"
        )
    if device is None:
        device = "cuda" if bundle.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ImplError("--device cuda but no CUDA device is available here (use --device cpu)")
    ref = impl_ref or bundle.impl
    # The surfaces the run declared (--features) go to whatever implementation replays the case.
    session.load(session.entry(bundle.op, ref, features=bundle.features), device)  # cannot run here: one line
    task = Task(
        index=0,
        op=bundle.op,
        seed=bundle.seed,
        spec=bundle.spec,
        impl_ref=ref,
        device=device,
        ulp=bundle.ulp,
        rerun=bundle.rerun,
        contract=bundle.contract,
        revision=revision,
        declared=bundle.features,
    )
    isolated = bundle.finding.kind in (Kind.CRASH, Kind.TIMEOUT) and not debug
    limit = timeout if timeout is not None else bundle.timeout if bundle.timeout is not None else DEFAULT_TIMEOUT
    executor = (
        WorkerPool(devices=[device if device == "cpu" else "cuda:0"], timeout=limit)
        if isolated
        else InProcess(session=session)
    )
    try:
        result = evaluate_sync(executor, task)
    finally:
        executor.close()
    if result is None:  # evaluate_sync answers None only past a deadline, and none was given
        raise RuntimeError("replay: the case gave no result")
    errors = [f for f in result.findings if f.severity is Severity.ERROR]
    return ReplayResult(
        bundle=bundle,
        impl_ref=ref,
        device=device,
        revision=revision,
        found=tuple((f, same_finding(f, bundle.finding)) for f in errors),
    )


class DebugSession(Session):
    """A session whose implementation of ``op`` stops in pdb just before each call (step into it
    with ``s``) and opens a post-mortem where the call raises, then lets the harness go on."""

    def __init__(self, *, table: OpTable, op: str) -> None:
        super().__init__(table=table)
        self._op = op

    def load(self, entry: ImplEntry, device: str, *, revision: str | None = None) -> Callable:
        fn = super().load(entry, device, revision=revision)
        return _at_call(fn) if entry.op == self._op else fn


def _at_call(fn: Callable) -> Callable:
    @functools.wraps(fn)  # its signature stays readable: the harness reads capabilities from it
    def call(*args: Any, **kwargs: Any) -> Any:
        print(f"mlafuzz replay --pdb: stopped before the call of {getattr(fn, '__qualname__', fn)}; s steps in")
        try:
            # The debugger stops at the next line: the call itself, so one ``s`` steps into ``fn``
            # (a line between them, such as a ``try:``, would take a ``s`` of its own).
            pdb.Pdb().set_trace(sys._getframe())
            return fn(*args, **kwargs)
        except bdb.BdbQuit:  # the user quit the debugger: no post-mortem of that
            raise
        except Exception:
            pdb.post_mortem(sys.exc_info()[2])
            raise

    return call


# --- a folder of bundles: a regression suite, a fuzz run's corpus -------------------------------


def bundle_dirs(path: Path, *, empty_ok: bool = False) -> list[Path]:
    """The bundles ``path`` names: itself (a bundle), a run folder's bundles/, or the bundle folders
    in it; BundleError when there are none, unless ``empty_ok`` and ``path`` is a folder (a corpus
    after a clean night: a run folder without bundles/, or an empty one)."""
    path = Path(path)
    if (path / "case.json").is_file():
        return [path]
    if not path.is_dir():
        raise BundleError(f"{str(path)!r} is not a bundle or a folder of bundles")
    inner = path / "bundles"
    where = inner if inner.is_dir() and not (path / "case.json").exists() else path
    found = sorted(p for p in where.iterdir() if p.is_dir() and (p / "case.json").is_file())
    if not found and not empty_ok:
        raise BundleError(f"{str(path)!r} holds no repro bundle (a folder with case.json)")
    return found


CORPUS_INDEX = -1_000_000  # corpus tasks count down from here: never a run's case index, nor shrinking's -1


def corpus_tasks(
    path: Path,
    *,
    impls: Mapping[str, str],
    device: str,
    ulp: int,
    revision: str,
    rejects: Mapping[str, tuple[str, ...]],
    shard: tuple[int, int] = (0, 1),
    features: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[list[Task], list[str], dict[int, str]]:
    """The bundles in ``path`` as tasks of a fuzz run: each bundle's case (spec, seed, error-input
    class, re-run) against the run's implementation of its op, judged under the run's revision.
    ``shard`` (K, N): bundle i (in name order) is shard i mod N's, so the shards of a nightly run
    share one corpus without replaying it N times. Returns the tasks, a note per bundle left
    out (another op, unreadable, an older schema) and each task's bundle (task index -> name)."""
    tasks: list[Task] = []
    notes: list[str] = []
    names: dict[int, str] = {}
    index, count = shard
    for d in bundle_dirs(path, empty_ok=True)[index::count]:
        try:
            b = read_bundle(d)
        except BundleError as exc:
            notes.append(f"{d.name}: left out: {exc}")
            continue
        if b.op not in impls:
            notes.append(f"{d.name}: left out: op {b.op} is not fuzzed in this run")
            continue
        names[CORPUS_INDEX - len(tasks)] = d.name
        tasks.append(
            Task(
                index=CORPUS_INDEX - len(tasks),
                op=b.op,
                seed=b.seed,
                spec=b.spec,
                impl_ref=impls[b.op],
                device=device,
                ulp=ulp,
                rerun=b.rerun,
                contract=b.contract,
                rejects=rejects.get(b.op),
                declared=(features or {}).get(b.op, ()),
                revision=revision,
            )
        )
    return tasks, notes, names


@dataclass(frozen=True, kw_only=True)
class CorpusOutcome:
    """What a corpus bundle's case did in this run: "fixed" (no error finding), "still fails"
    (``kinds``: the error findings' kinds), "skipped" (``why``) or "not run" (the run stopped first)."""

    bundle: str
    status: str
    kinds: tuple[str, ...] = ()
    why: str = ""


class CorpusFirst:
    """An executor that runs ``tasks`` (a corpus) before any case the fuzz loop hands it: it shows
    no free slot until each of them is submitted, and its results come back through ``wait`` like
    any case's, so the loop records, buckets, shrinks and bundles them as its own."""

    def __init__(self, inner: Executor, tasks: Sequence[Task], names: Mapping[int, str] | None = None) -> None:
        self._inner = inner
        self._todo = collections.deque(tasks)
        self._names = dict(names or {})  # corpus task index -> its bundle's name
        self._results: dict[int, Any] = {}  # corpus task index -> its TaskResult, as it comes back

    def outcomes(self) -> list[CorpusOutcome]:
        """Each corpus bundle's outcome, in corpus order (a task that never came back: not run)."""
        out = []
        for index, name in self._names.items():
            result = self._results.get(index)
            if result is None:
                out.append(CorpusOutcome(bundle=name, status="not run"))
            elif result.skipped:
                out.append(CorpusOutcome(bundle=name, status="skipped", why=str(result.skipped)))
            else:
                kinds = tuple(dict.fromkeys(f.kind.value for f in result.findings if f.severity is Severity.ERROR))
                out.append(CorpusOutcome(bundle=name, status="still fails" if kinds else "fixed", kinds=kinds))
        return out

    def free_slots(self) -> int:
        while self._todo and self._inner.free_slots():
            self._inner.submit(self._todo.popleft())
        return 0 if self._todo else self._inner.free_slots()

    def in_flight(self) -> int:
        return self._inner.in_flight()

    def submit(self, task: Task) -> None:
        self._inner.submit(task)

    def wait(self, timeout: float) -> list:
        done = self._inner.wait(timeout)
        for task, result in done:  # the first: shrinking re-submits a bucket's task as smaller variants
            if task.index in self._names:
                self._results.setdefault(task.index, result)
        return done

    def quarantine(self, classes: frozenset[tuple[str, str, str]]) -> None:
        self._inner.quarantine(classes)

    def restarts(self) -> int:
        return self._inner.restarts()

    def drop_queued(self) -> list[Task]:
        """The unstarted cases, given back when the budget ends (the corpus's own not yet handed
        on are left out: the loop never counted them)."""
        self._todo.clear()
        return drop_queued(self._inner)

    def cancel(self) -> None:
        self._todo.clear()
        self._inner.cancel()

    def close(self) -> None:
        self._inner.close()


# --- a bundle's case as a plain call -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BundleCall:
    """A bundle's case, ready to call any implementation of its op exactly as the fuzzer did."""

    bundle: Bundle
    case: Any  # generators' Case
    table: OpTable

    def __call__(self, fn: Callable) -> dict[str, Any]:
        """Call ``fn`` on fresh copies of the case's inputs (outputs allocated as the harness does)
        and return its outputs; an exception of ``fn`` propagates, for the debugger."""
        op = self.table.get(self.bundle.op)
        inputs = self.case.cloned_tensors()
        guards = op.guarded(self.case, PATTERNS[0]) if op.guarded else {}
        args = {**inputs, **{k: g.view for k, g in guards.items()}}
        sub = Session(table=self.table).sub(self.case.device)
        outputs = op.invoke(fn, self.case, args, sub)
        return {**outputs, **op.derived(self.case, args)} if op.derived is not None else outputs

    def expected(self) -> dict[str, Any]:
        """What a correct implementation returns: the op's reference outputs."""
        return self.table.get(self.bundle.op).oracle_slow(self.case)


def load_bundle_call(path: Path | str, *, device: str = "cpu", table: OpTable | None = None) -> BundleCall:
    """The bundle at ``path`` as a ``BundleCall`` (its case made on ``device``, its inputs checked
    against its spec and seed)."""
    from mlafuzz.harness.ops.names import NEWEST_REVISION
    from mlafuzz.harness.ops.table import OPS

    table = table or OPS
    bundle = read_bundle(Path(path))
    check_inputs(bundle, table)
    case = table.materialize(table.decode(bundle.spec), bundle.seed, device)
    case = dataclasses.replace(case, params={**case.params, "revision": bundle.revision or NEWEST_REVISION})
    return BundleCall(bundle=bundle, case=case, table=table)
