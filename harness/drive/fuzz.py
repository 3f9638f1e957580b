"""The fuzz driver: hand out tasks, run them on an executor, record, shrink, bundle.

Case i of a run is a pure function of (seed, i): its op (the run's mix, mix.py:
rounds of sum(shares) cases, each op taking its share, so each op gets about an
equal share of the run's time), its spec and its tensors, and whether it also
runs an error input or a second run. That makes a run reproducible from its seed
and lets ``--shard K/N`` split the case space into disjoint, deterministic
slices: shard K owns the rounds numbered K mod N, so every shard fuzzes every op
in the unsharded mix, and the shards together are the unsharded run.
Findings are appended to findings.jsonl as they arrive. After the main loop each
new bucket's first failing case is written as a repro bundle at once (so a stop
while shrinking, or ``--shrink-budget 0``, still leaves one), then shrunk, and
the shrunk case replaces it; a stop during shrinking writes the smallest case in
hand. The budget is a promise (budget.py): when cases stop, the cases no worker has started
are dropped (counted in summary.json's ``dropped``, and run first by a
``resume``), the ones running get a short grace and are then cut (``cut``, run first by a
``resume`` too), and shrinking ends with the budget. findings.jsonl keeps at most
``MAX_LINES_PER_BUCKET`` lines of a bucket (a broken implementation fails every
case); summary.json's ``bucket_counts`` holds every bucket's full count, which
is what reports count. A run goes on in its folder with ``resume`` (resume.py):
summary.json says where it stopped.

An error-input class that crashes a worker for an implementation is reported
once (a CRASH naming the class) and quarantined for that implementation for
the rest of the run: a worker restart costs seconds, and a run must not spend
them again and again on one known crash.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from mlafuzz.generators.draw import Knobs
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.check.compare import Policy
from mlafuzz.harness.drive.budget import BudgetPlan
from mlafuzz.harness.drive.mix import Mix
from mlafuzz.harness.drive.resume import Resume
from mlafuzz.harness.drive.shrink import ShrinkResult, evaluate_sync, shrink
from mlafuzz.harness.drive.tasks import HARNESS_ERROR, Task, TaskResult
from mlafuzz.harness.drive.workers import Executor, drop_queued
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.atomic import atomic_write
from mlafuzz.reports.bundle import replay_command, slug, write_bundle
from mlafuzz.reports.findings import Finding, Kind, Severity
from mlafuzz.reports.jsonl import FINDINGS_FILE, JsonlSink
from mlafuzz.reports.model import BUCKET_SEP
from mlafuzz.reports.model import bucket_counts as read_bucket_counts

MAX_LINES_PER_BUCKET = 50  # a broken impl fails every case; keep the file readable


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised in the main thread by the CLI's handler: the run stops like on Ctrl-C
    (summary written, workers ended), and the exit status says which it was."""


def case_seed(seed: int, op: str, index: int) -> int:
    """The seed of case ``index`` of ``op`` in a run seeded ``seed`` (63 bits, stable across Pythons)."""
    digest = hashlib.sha256(f"mlafuzz:{seed}:{op}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True, kw_only=True)
class Shard:
    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (self.count >= 1 and 0 <= self.index < self.count):
            raise ValueError(f"shard={self.index}/{self.count} must satisfy 0 <= K < N")

    def owns(self, i: int, *, size: int = 1) -> bool:
        """Case i is this shard's: its round of ``size`` consecutive cases (the run's mix, a
        whole number of each op's) is."""
        return (i // max(size, 1)) % self.count == self.index

    def part(self, k: int, parts: int) -> Shard:
        """Part ``k`` of ``parts`` of this shard (the pytest plugin's item k under xdist): this
        shard's rounds numbered k mod ``parts``, so the parts together are exactly this shard."""
        if not 0 <= k < parts:
            raise ValueError(f"part={k}/{parts} must satisfy 0 <= k < parts")
        return Shard(index=self.index + k * self.count, count=self.count * parts)

    @staticmethod
    def part_cases(cases: int, *, size: int, k: int, parts: int) -> int:
        """How many of this shard's first ``cases`` cases part ``k`` of ``parts`` owns: whole
        rounds of ``size`` go to the parts in turn, the last round's rest to its part. Each part
        running that many of its own cases runs exactly the shard's first ``cases``."""
        size = max(size, 1)
        rounds, rest = divmod(cases, size)
        mine = max(0, (rounds - k + parts - 1) // parts)
        return mine * size + (rest if rounds % parts == k else 0)


@dataclass(frozen=True, kw_only=True)
class FuzzConfig:
    ops: tuple[str, ...]
    impls: Mapping[str, str]  # op -> --impl reference (resolved again inside workers)
    device: str = "cpu"
    cases: int | None = None  # per run (this shard), None = until the budget
    budget: float | None = None  # seconds
    seed: int = 0
    out_dir: Path = Path("mlafuzz-out")
    knobs: Knobs = Knobs()
    policy: Policy = Policy()
    fixed_spec: Any | None = None  # run this spec with varying seeds instead of drawing
    shard: Shard = Shard()
    rerun_every: int = 4  # every Nth case runs twice, compared bit for bit (NONDETERMINISM)
    contract_every: int = 3  # every Nth case also runs one error-input class (ACCEPTED_INVALID_INPUT)
    shrink_budget: float = 0.0  # seconds per new bucket; 0: no shrinking (each bucket bundled as found)
    rejects: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # weaker contracts per op
    features: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # declared optional surfaces per op
    table: OpTable = OPS
    revision: str = NEWEST_REVISION  # the contract revision (SPEC 7) cases are judged under; an entry's pin wins
    release: str | None = None  # the vLLM release --revision auto followed to pick ``revision`` (None: not auto)
    timeout: float | None = None  # the executor's per-case limit: recorded in bundles, bounds TIMEOUT shrinks
    shares: Mapping[str, int] | None = None  # op -> its slots per round (mix.py); None, or an op left out: its row's
    ledger: Mapping[str, Any] | None = None  # harness.ledger.ledger_record: run.json keeps it for report and merge

    def __post_init__(self) -> None:
        if self.cases is None and self.budget is None:
            raise ValueError("FuzzConfig: give cases=N or budget=SECONDS (or both)")
        missing = [op for op in self.ops if op not in self.impls]
        if missing:
            raise ValueError(f"FuzzConfig: ops={missing!r} have no implementation selected")
        self.mix  # noqa: B018 -- a bad share is refused here, not at the first case

    @functools.cached_property
    def mix(self) -> Mix:
        """Which op case i is, and its count among that op's cases (computed once per config)."""
        given = self.shares or {}
        return Mix.of(self.ops, {op: given[op] if op in given else self.table.get(op).share for op in self.ops})

    @functools.cached_property
    def plan(self) -> BudgetPlan | None:
        """How the budget is split (None: a --cases run, no budget to keep)."""
        if self.budget is None:
            return None
        return BudgetPlan.of(budget=self.budget, timeout=self.timeout, shrink_budget=self.shrink_budget)

    def run_json(self) -> dict[str, Any]:
        """run.json: the run's configuration; resume.CASE_KEYS of it decide what case i is."""
        return {
            "ops": list(self.ops),
            "impls": dict(self.impls),
            "device": self.device,
            "seed": self.seed,
            "shard": f"{self.shard.index}/{self.shard.count}",
            "cases": self.cases,
            "budget": self.budget,
            "ulp": self.policy.ulp,
            "knobs": dataclasses.asdict(self.knobs),
            "spec": spec_to_dict(self.fixed_spec) if self.fixed_spec is not None else None,
            "rejects": {op: list(v) for op, v in sorted(self.rejects.items())},
            "features": {op: list(v) for op, v in sorted(self.features.items())},
            "rerun_every": self.rerun_every,
            "contract_every": self.contract_every,
            "timeout": self.timeout,
            "revision": self.revision,
            **({"vllm_release": self.release} if self.release else {}),
            "shares": self.mix.to_json(),
            "ledger": self.ledger,
        }

    @functools.cached_property
    def _run_knobs(self) -> Knobs:
        """``knobs.for_run(seed)``, made once: every task carries it (a copy per task was a
        measurable share of the parent's time per case)."""
        return self.knobs.for_run(self.seed)

    def task(self, i: int, *, held: frozenset[tuple[str, str, str]] = frozenset()) -> Task:
        """Case i: its op, seed, error-input class and re-run are pure functions of (seed, i), the
        last two counted in the op's own cases (r: how many of its op come before it), so every op
        gets error inputs and re-runs at the same rate whatever its share; its spec is drawn from
        them where it runs (``Task.spec_obj``), unless the run has a fixed one. ``held``:
        quarantined (op, impl, class) triples, whose turn goes to the next class."""
        op = self.mix.op(i)
        r = self.mix.own(i)
        seed = case_seed(self.seed, op, i)
        spec = spec_to_dict(self.fixed_spec) if self.fixed_spec is not None else None
        contract = None
        classes = self.table.get(op).rotation(self.rejects.get(op))
        if classes and self.contract_every and r % self.contract_every == 1:
            first = (r // self.contract_every) % len(classes)
            turn = classes[first:] + classes[:first]
            contract = next((c for c in turn if (op, self.impls[op], c) not in held), None)
        return Task(
            index=i,
            op=op,
            seed=seed,
            spec=spec,
            knobs=self._run_knobs,  # compile-relevant options from the run's deployments
            impl_ref=self.impls[op],
            device=self.device,
            ulp=self.policy.ulp,
            rerun=bool(self.rerun_every) and r % self.rerun_every == 0,
            contract=contract,
            rejects=self.rejects.get(op),
            declared=self.features.get(op, ()),
            revision=self.revision,
        )


@dataclass(kw_only=True)
class FuzzSummary:
    cases: int = 0
    skipped: int = 0
    skip_reasons: collections.Counter = field(default_factory=collections.Counter)  # why -> skipped cases
    dropped: int = 0  # cases queued but not started when the budget ended (a resume runs them first)
    cut: int = 0  # cases still running after the budget's grace, ended unjudged (a resume runs them first)
    per_op: collections.Counter = field(default_factory=collections.Counter)
    by_kind: collections.Counter = field(default_factory=collections.Counter)
    coverage: collections.Counter = field(default_factory=collections.Counter)
    findings: int = 0  # error-severity findings
    infos: int = 0
    tie_hits: int = 0  # exact e2m1 ties written as the other neighbour, accepted (nvfp4_writer under --ties either)
    buckets: dict = field(default_factory=dict)  # dedup key -> (task, first finding)
    bundles: list = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False
    terminated: bool = False  # the interruption was a SIGTERM (CI's cancel)
    quarantined: set = field(default_factory=set)  # (op, impl, error-input class) that crashed a worker
    quarantined_crashes: int = 0  # crashes of a quarantined class after its first (queued before it was held)
    worker_restarts: int = 0  # workers replaced while the cases ran (shrinking's own not counted)
    bucket_counts: collections.Counter = field(default_factory=collections.Counter)  # dedup key -> findings
    known: frozenset = frozenset()  # error buckets of the run's earlier sessions (--resume): not shrunk again
    next_case: int = 0  # the next case index the run would look at
    unfinished: tuple[int, ...] = ()  # cases in flight when the run stopped: a resume runs them first
    sessions: int = 1

    @property
    def rate(self) -> float:
        return self.cases / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "skipped": self.skipped,
            "skip_reasons": dict(self.skip_reasons),
            "dropped": self.dropped,
            "cut": self.cut,
            "per_op": dict(self.per_op),
            "by_kind": dict(self.by_kind),
            "coverage": dict(self.coverage),
            "findings": self.findings,
            "infos": self.infos,
            "tie_hits": self.tie_hits,
            "buckets": len(set(self.buckets) | self.known),
            "bundles": self.bundles,
            "bucket_counts": {BUCKET_SEP.join(k): n for k, n in self.bucket_counts.items()},
            # findings.jsonl keeps a bucket's first MAX_LINES_PER_BUCKET lines; these are the rest
            "lines_dropped": sum(max(0, n - MAX_LINES_PER_BUCKET) for n in self.bucket_counts.values()),
            "seconds": round(self.seconds, 3),
            "cases_per_second": round(self.rate, 3),
            "interrupted": self.interrupted,
            "terminated": self.terminated,
            "quarantined": [list(k) for k in sorted(self.quarantined)],
            "quarantined_crashes": self.quarantined_crashes,
            "worker_restarts": self.worker_restarts,
            "next_case": self.next_case,
            "unfinished": list(self.unfinished),
            "sessions": self.sessions,
        }

    @classmethod
    def resumed(cls, resume: Resume) -> FuzzSummary:
        """The counts of a run's earlier sessions, to go on adding to."""
        s = resume.summary

        def counter(key: str) -> collections.Counter:
            value = s.get(key)
            return collections.Counter(
                {k: v for k, v in value.items() if isinstance(v, int)} if isinstance(value, Mapping) else {}
            )

        return cls(
            cases=int(s.get("cases", 0)),
            skipped=int(s.get("skipped", 0)),
            skip_reasons=counter("skip_reasons"),
            dropped=int(s.get("dropped", 0)),
            cut=int(s.get("cut", 0)),
            per_op=counter("per_op"),
            by_kind=counter("by_kind"),
            coverage=counter("coverage"),
            findings=int(s.get("findings", 0)),
            infos=int(s.get("infos", 0)),
            tie_hits=int(s.get("tie_hits", 0)),
            bundles=list(s.get("bundles") or ()),
            seconds=float(s.get("seconds", 0.0)),
            quarantined={tuple(k) for k in s.get("quarantined") or () if len(k) == 3},
            quarantined_crashes=int(s.get("quarantined_crashes", 0)),
            worker_restarts=int(s.get("worker_restarts", 0)),
            bucket_counts=collections.Counter(read_bucket_counts(s)),
            known=resume.known_buckets,
            next_case=resume.next_case,
            sessions=int(s.get("sessions", 1)) + 1,
        )


class Recorder:
    """Counts results and appends findings to findings.jsonl as they arrive."""

    def __init__(
        self, sink: JsonlSink, summary: FuzzSummary, on_finding: Callable[[Finding], None] | None, executor: Executor
    ) -> None:
        self.sink, self.summary, self.on_finding, self.executor = sink, summary, on_finding, executor

    def _quarantine(self, f: Finding) -> bool:
        """True when ``f`` repeats a crash of an already quarantined class (it is then only
        counted); a first one quarantines the class, here and in every worker."""
        klass = f.extra.get("invalid_class") if f.kind in (Kind.CRASH, Kind.TIMEOUT) else None
        if not klass or f.extra.get("part") != "contract":
            return False
        key = (f.op, f.impl, str(klass))
        if key in self.summary.quarantined:
            self.summary.quarantined_crashes += 1
            return True
        self.summary.quarantined.add(key)
        self.executor.quarantine(frozenset(self.summary.quarantined))
        return False

    def record(self, task: Task, result: TaskResult) -> None:
        s = self.summary
        if result.skipped:
            s.skipped += 1
            s.skip_reasons[result.skipped] += 1
            return
        s.cases += 1
        s.per_op[task.op] += 1
        s.coverage.update(result.features)
        for f in result.findings:
            if self._quarantine(f):
                continue
            if f.severity is Severity.ERROR:
                s.findings += 1
                s.by_kind[f.kind.value] += 1
                if f.dedup_key not in s.buckets and f.dedup_key not in s.known:
                    # the task as it ran, its spec written out for shrinking
                    spec = result.spec if result.spec is not None else task.spec
                    s.buckets[f.dedup_key] = (dataclasses.replace(task, spec=spec) if spec is not None else task, f)
            else:
                s.infos += 1
                s.tie_hits += int(f.extra.get("tie_hits", 0))
            s.bucket_counts[f.dedup_key] += 1
            if s.bucket_counts[f.dedup_key] <= MAX_LINES_PER_BUCKET:
                line = f.to_json()
                line["extra"] = {**line["extra"], "features": sorted(result.features)}  # for reports' coverage
                self.sink.write(line)
            if self.on_finding:
                self.on_finding(f)


def fuzz(
    config: FuzzConfig,
    *,
    executor: Executor,
    on_finding: Callable[[Finding], None] | None = None,
    on_progress: Callable[[dict[str, Any], float], None] | None = None,
    stop_when: Callable[[FuzzSummary], bool] | None = None,
    resume: Resume | None = None,
    on_shrink: Callable[[str, dict[str, Any]], None] | None = None,
    ready: Callable[[str], bool] | None = None,
    started: float | None = None,
) -> FuzzSummary:
    """Run until ``config.cases`` or ``config.budget``; findings go to out_dir/findings.jsonl.
    ``resume``: the run's earlier sessions in out_dir, continued (their counts kept, their cases
    not run again); ``on_shrink`` hears the shrinking of each new bucket (see shrink_and_bundle).
    ``ready(op)``: False while an op's kernels still build (a cold start's CUDA extension): in a
    budget run its cases wait, in order, while the other ops' go first (a case's content never
    depends on when it runs). A --cases run keeps its exact case set and order, so it holds every
    case until the build ends: else each worker that drew such a case would block on the build
    lock, each printing that it waits, and the others' cases would wait behind them anyway.
    ``started`` (``time.monotonic()``): when the budget's clock started, the command's start (its
    imports and loading count against the budget too); default now."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(config.out_dir / "run.json", json.dumps(config.run_json(), indent=2) + "\n")
    summary = FuzzSummary.resumed(resume) if resume is not None else FuzzSummary()
    if summary.quarantined:
        executor.quarantine(frozenset(summary.quarantined))
    base_seconds = summary.seconds
    restarts_before = executor.restarts() - summary.worker_restarts  # an executor may outlive a run (mutants)
    start = time.monotonic() if started is None else started
    pending = collections.deque(resume.unfinished if resume is not None else ())  # run first, in order
    index = max(summary.next_case, 0)
    submitted = 0
    in_flight: set[int] = set()
    deferred: collections.deque[int] = collections.deque()  # cases of ops still building, in order
    can_defer = ready is not None and config.cases is None
    budget_ended = False
    plan = config.plan
    cut_at: float | None = None  # when the cases still running are cut (the budget's grace ends)
    with JsonlSink(config.out_dir / FINDINGS_FILE) as sink:
        recorder = Recorder(sink, summary, on_finding, executor)
        try:
            while True:
                elapsed = time.monotonic() - start
                in_budget = plan is None or elapsed < plan.cases_until(shrinking=_shrinking(config, summary))
                budget_left = in_budget and not (stop_when is not None and stop_when(summary))
                if not budget_left and not budget_ended:
                    # The cases no worker has started are not run: each could cost a whole
                    # --timeout (a hanging kernel), and the budget is a promise.
                    budget_ended = True
                    summary.dropped += len(drop_queued(executor))  # still in in_flight: a resume runs them
                    cut_at = plan.cut_at(elapsed) if plan is not None else None
                waiting = {op for op in config.ops if not ready(op)} if ready is not None else set()
                # Nothing to hand out yet: every op still builds, or a --cases run (which does not
                # reorder) has an op that does.
                hold = bool(waiting) and (len(waiting) == len(config.ops) or not can_defer)
                while (
                    budget_left
                    and not hold
                    and (config.cases is None or submitted < config.cases)
                    and executor.free_slots()
                ):
                    if pending:
                        i = pending.popleft()
                    elif deferred and config.mix.op(deferred[0]) not in waiting:
                        i = deferred.popleft()
                    else:
                        while not config.shard.owns(index, size=config.mix.size):
                            index += 1
                        i, index = index, index + 1
                        if config.mix.op(i) in waiting:
                            deferred.append(i)
                            continue
                    in_flight.add(i)
                    executor.submit(config.task(i, held=frozenset(summary.quarantined)))
                    submitted += 1
                more = budget_left and (config.cases is None or submitted < config.cases)
                if not more and not executor.in_flight():
                    break
                if cut_at is not None and elapsed >= cut_at:
                    # Past the grace: the cases still running are ended unjudged (a hang is not
                    # a TIMEOUT before its --timeout) and stay in in_flight, so a resume runs them.
                    summary.cut += executor.in_flight()
                    executor.cancel()
                    break
                for task, result in executor.wait(0.1):
                    in_flight.discard(task.index)
                    recorder.record(task, result)
                summary.worker_restarts = executor.restarts() - restarts_before
                if on_progress:
                    summary.seconds = base_seconds + time.monotonic() - start
                    on_progress(summary.to_json(), time.monotonic() - start)
        except KeyboardInterrupt as exc:
            _stopped(summary, exc)
        summary.seconds = base_seconds + time.monotonic() - start
        summary.next_case = index
        summary.unfinished = tuple(sorted(in_flight | set(pending) | set(deferred)))
        _write_summary(config, summary)
        try:
            todo = _to_bundle(summary)
            for key, task, finding in todo:  # each bucket as found, before any shrinking
                _bundle(config, summary, executor, key=key, finding=finding, result=_as_found(task, finding, config))
            _write_summary(config, summary)
            if config.shrink_budget > 0 and not summary.interrupted:
                deadline = start + plan.total if plan is not None else None  # shrinking ends with the budget
                shrink_and_bundle(config, summary, executor, on_shrink=on_shrink, todo=todo, deadline=deadline)
        except KeyboardInterrupt as exc:
            _stopped(summary, exc)
        _write_summary(config, summary)
    return summary


def _shrinking(config: FuzzConfig, summary: FuzzSummary) -> bool:
    """Whether a new bucket waits to be shrunk (the budget then keeps its shrink reserve)."""
    return config.shrink_budget > 0 and any(f.cause != HARNESS_ERROR for _, f in summary.buckets.values())


def _stopped(summary: FuzzSummary, exc: KeyboardInterrupt) -> None:
    summary.interrupted = True
    summary.terminated = summary.terminated or isinstance(exc, Terminated)


def _to_bundle(summary: FuzzSummary) -> list[tuple[tuple, Task, Finding]]:
    """The new buckets a bundle is written for (a harness error is no implementation's repro)."""
    return [(key, task, finding) for key, (task, finding) in summary.buckets.items() if finding.cause != HARNESS_ERROR]


def _as_found(task: Task, finding: Finding, config: FuzzConfig) -> ShrinkResult:
    """A bucket's first failing case as a shrink that has not started."""
    return ShrinkResult(
        task=task.with_spec(config.table), finding=finding, attempts=0, accepted=0, seconds=0.0, complete=False
    )


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold SIGINT and SIGTERM off while a bundle's files are written (the stop they ask for comes
    right after): a bundle is never left half old case, half new. Handlers, not a signal mask: in
    a process with other threads the kernel may hand the signal to one of them, and Python then
    runs the handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, Any]] = []
    before = {s: signal.signal(s, lambda signum, frame: caught.append((signum, frame))) for s in _STOPS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)  # None: not set from Python
        if caught:
            signum, frame = caught[0]
            handler = before[signum]
            if callable(handler):
                handler(signum, frame)  # KeyboardInterrupt, or the CLI's Terminated
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


_STOPS = (signal.SIGINT, signal.SIGTERM)


def _write_summary(config: FuzzConfig, summary: FuzzSummary) -> None:
    atomic_write(config.out_dir / "summary.json", json.dumps(summary.to_json(), indent=2) + "\n")


def shrink_and_bundle(
    config: FuzzConfig,
    summary: FuzzSummary,
    executor: Executor,
    *,
    on_shrink: Callable[[str, dict[str, Any]], None] | None = None,
    todo: list[tuple[tuple, Task, Finding]] | None = None,
    deadline: float | None = None,
) -> None:
    """Shrink each new bucket within ``config.shrink_budget`` and write its repro bundle over the
    one written as found; ``deadline`` (``time.monotonic()``): the run's budget ends then, and so
    does shrinking (a bucket left with no time keeps its bundle as found). A stop (Ctrl-C, SIGTERM) while shrinking writes the smallest case in
    hand, then goes on as a stop. ``on_shrink(event, facts)`` hears "start" (bucket, number, of,
    budget), "step" (attempts, accepted, size: after each attempt) and "done" (attempts, accepted,
    seconds, size, complete)."""
    table = config.table
    todo = _to_bundle(summary) if todo is None else todo
    for number, (key, task, finding) in enumerate(todo, 1):
        budget = config.shrink_budget if deadline is None else min(config.shrink_budget, deadline - time.monotonic())
        if on_shrink is not None:
            on_shrink("start", {"bucket": key, "number": number, "of": len(todo), "budget": max(budget, 0.0)})
        if budget <= 0:
            if on_shrink is not None:
                size = table.get(task.op).size(table.decode(task.spec))
                facts = {"attempts": 0, "accepted": 0, "seconds": 0.0, "size": size, "complete": False}
                on_shrink("done", {"bucket": key, **facts, "note": "the budget has ended: bundled as found"})
            continue

        def step(attempts: int, accepted: int, spec: dict[str, Any], op: str = task.op) -> None:
            if on_shrink is not None:
                on_shrink(
                    "step", {"attempts": attempts, "accepted": accepted, "size": table.get(op).size(table.decode(spec))}
                )

        with _running_its_class(executor, summary, task, finding):
            result = shrink(
                task=task.with_spec(table),
                finding=finding,
                evaluate=lambda t, deadline: evaluate_sync(executor, t, deadline=deadline),
                budget=budget,
                table=table,
                on_step=step,
                attempt_seconds=config.timeout if finding.kind is Kind.TIMEOUT else 0.0,
            )
            if result.stopped is None:  # its check runs the class too
                entry = _bundle(config, summary, executor, key=key, finding=finding, result=result, deadline=deadline)
        if result.stopped is not None:
            if result.accepted:
                _bundle(config, summary, executor, key=key, finding=finding, result=result)
            raise result.stopped
        if on_shrink is not None:
            limit = config.timeout if finding.kind is Kind.TIMEOUT else None
            note = (
                f"a TIMEOUT shows only after --timeout {limit:g} s, more than the {budget:g} s"
                " shrink budget: bundled as found"
                if limit is not None and not result.attempts
                else ""
            )
            on_shrink(
                "done",
                {
                    "bucket": key,
                    "attempts": result.attempts,
                    "accepted": result.accepted,
                    "seconds": result.seconds,
                    "size": entry["size"],
                    "complete": result.complete,
                    "note": note,
                },
            )


@contextlib.contextmanager
def _running_its_class(executor: Executor, summary: FuzzSummary, task: Task, finding: Finding) -> Iterator[None]:
    """While the bucket of a quarantined error-input class is shrunk, that class runs again for its
    implementation. The quarantine keeps the fuzz loop from crashing on it over and over; a shrink
    must run it, or no attempt can show the finding (every attempt had the class stripped: a
    contract crash's shrink made 100 attempts and kept none)."""
    held = frozenset(summary.quarantined)
    mine = (task.op, task.impl_ref, str(finding.extra.get("invalid_class")))
    if mine not in held:
        yield
        return
    executor.quarantine(held - {mine})
    try:
        yield
    finally:
        executor.quarantine(held)


def _bundle(
    config: FuzzConfig,
    summary: FuzzSummary,
    executor: Executor,
    *,
    key: tuple,
    finding: Finding,
    result: ShrinkResult,
    deadline: float | None = None,
) -> dict[str, Any]:
    """The repro bundle of a bucket (as found, or shrunk: it replaces the one as found), and its
    line in summary.json's ``bundles``; returns that line."""
    table = config.table
    small = result.task
    spec = table.decode(small.spec)
    size = table.get(small.op).size(spec)
    shrunk = result.accepted > 0 or result.complete
    # The loop oracle confirms the minimized case (the vectorized one found it); a case as found,
    # or one a stop left, is written without waiting for that.
    verified = None
    if shrunk and result.stopped is None and finding.kind not in (Kind.CRASH, Kind.TIMEOUT):
        check = evaluate_sync(executor, dataclasses.replace(small, slow_oracle=True, index=-1), deadline=deadline)
        verified = (  # None: the budget ended before the check could
            None if check is None else any(f.kind == finding.kind and f.cause == finding.cause for f in check.findings)
        )
    case = table.materialize(spec, small.seed, "cpu")
    name = "-".join(key)
    path = config.out_dir / "bundles" / slug(name)
    final = dataclasses.replace(result.finding, repro=replay_command(path, op=small.op, impl=small.impl_ref))
    with _uninterrupted():
        write_bundle(
            root=config.out_dir / "bundles",
            name=name,
            op=small.op,
            spec=small.spec,
            seed=small.seed,
            impl=small.impl_ref,
            device=config.device,
            ulp=small.ulp,
            rerun=small.rerun,
            contract=small.contract,
            finding=final,
            inputs=case.generated_tensors(),
            timeout=config.timeout,
            features=small.declared,
            extra={
                "shrink": {
                    "attempts": result.attempts,
                    "accepted": result.accepted,
                    "seconds": round(result.seconds, 2),
                    "size": size,
                    "complete": result.complete,
                    "shrunk": shrunk,  # False: the case as found (not shrunk yet, or --shrink-budget 0)
                    "stopped": result.stopped is not None,  # a stop ended the shrink: the smallest in hand
                    "loop_oracle_agrees": verified,
                },
                "zero_blocks": dict(case.zero_blocks),
            },
        )
        entry = {
            "bucket": list(key),
            "path": str(path),
            "replay": final.repro,
            "size": size,
            "shrink_seconds": round(result.seconds, 2),
        }
        at = next((j for j, b in enumerate(summary.bundles) if b.get("bucket") == list(key)), None)
        if at is None:
            summary.bundles.append(entry)
        else:  # the shrunk case replaces the one as found, in its place
            summary.bundles[at] = entry
    return entry
