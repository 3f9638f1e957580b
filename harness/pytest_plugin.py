"""pytest plugin: fuzz implementations as test items, one per op and implementation.

Inactive unless ``--mlafuzz-budget SECONDS`` or ``--mlafuzz-cases N`` is given (either
switches it on). Then the session gets an item per ``--mlafuzz-impl OP=REF`` (repeatable;
default: the device's own implementations), e.g. ``mlafuzz::gather[torch]``.
Each item runs the fuzz loop for the budget (or N cases, whichever ends first: a count is the
same work on any machine) and fails with its findings (the first few buckets, each
with its message and replay command); with ``--mlafuzz-ledger FILE`` only
findings the ledger doesn't expect fail, and stale ledger entries are listed
in the terminal summary. The budget holds as ``mlafuzz fuzz``'s does (drive/budget.py) when
cases run in a worker process (``--mlafuzz-isolate``; ``--mlafuzz-timeout`` is their limit).

Under pytest-xdist with W workers, each op and implementation is W items, part k of W
(``mlafuzz::gather[torch-part0of2]``): part k fuzzes the rounds numbered k mod W of the case
space, and with ``--mlafuzz-cases N`` its share of the first N cases, so the parts together are
exactly the run without xdist, whichever worker takes which part, the same on every run. A
budget is the op's in all: each part gets SECONDS / W (a session lasts as long as before). Worker
``gwN`` runs on GPU ``N % device_count`` of the GPUs the caller made visible. A CI job split into
copies (MLAFUZZ_SHARD=K/N, or Buildkite's BUILDKITE_PARALLEL_JOB/_COUNT, as ``mlafuzz fuzz
--shard auto`` reads them) splits each copy's slice again into the parts. On a machine without
CUDA the items run the CPU implementations with Triton's interpreter. Each item writes its
findings to ``OUT/<op>-<impl>-main/`` (``--mlafuzz-out``, default ``./mlafuzz-out``), or under
xdist ``OUT/<op>-<impl>-part<k>of<W>/``.

This module is loaded by every pytest run once installed (entry point
``pytest11``), so it imports nothing heavy until the plugin is switched on.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.ledger import Ledger
    from mlafuzz.kernels.entry import ImplEntry

SESSION_PLUGIN = "mlafuzz-session"
LOADED_AT = time.monotonic()  # pytest loads this module as it starts: the first item's budget counts from here
MAX_BUCKETS_SHOWN = 5


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("mlafuzz", "mlafuzz: differential fuzzing of sparse-MLA KV-cache kernels")
    g.addoption(
        "--mlafuzz-cases",
        type=int,
        default=None,
        metavar="N",
        help="fuzz each op/implementation for N cases, split among the xdist workers' parts (with or"
        " instead of --mlafuzz-budget; either switches the plugin on)",
    )
    g.addoption(
        "--mlafuzz-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fuzz each op/implementation for SECONDS, split among the xdist workers' parts (with or"
        " instead of --mlafuzz-cases; either switches the plugin on)",
    )
    g.addoption(
        "--mlafuzz-impl",
        action="append",
        default=[],
        metavar="OP=REF",
        help="implementation to fuzz (repeatable; an op may appear more than once); "
        "default: the device's own implementations",
    )
    g.addoption(
        "--mlafuzz-features",
        action="append",
        default=[],
        metavar="OP=NAME,...",
        help="optional surfaces an implementation takes that its signature does not name (a **kwargs"
        " wrapper), as mlafuzz fuzz --features (repeatable)",
    )
    g.addoption("--mlafuzz-seed", type=int, default=0, metavar="N", help="run seed (default 0)")
    g.addoption(
        "--mlafuzz-out",
        default=None,
        metavar="DIR",
        help="findings go to DIR/<op>-<impl>-<worker>/ (default ./mlafuzz-out)",
    )
    g.addoption(
        "--mlafuzz-ledger",
        default=None,
        metavar="FILE",
        help="expected-failures ledger (TOML or JSON): only unexpected findings fail",
    )
    g.addoption(
        "--mlafuzz-device", choices=("cpu", "cuda"), default=None, help="default: cuda when available, else cpu"
    )
    g.addoption(
        "--mlafuzz-shrink-budget",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time to minimize each new finding bucket into a repro bundle (default 10; 0: none)",
    )
    g.addoption(
        "--mlafuzz-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="per-case limit in the worker process (--mlafuzz-isolate) before the case is a TIMEOUT"
        " (default 120); a case running when the budget ends gets the smaller of this and a short grace",
    )
    g.addoption(
        "--mlafuzz-isolate",
        action="store_true",
        help="run cases in a spawned worker process: a crashing or hanging impl becomes a finding"
        " instead of taking the pytest worker down (slower start)",
    )


@dataclass(frozen=True, kw_only=True)
class Worker:
    """Which xdist worker this process is: gwN of count, or the only process ('main')."""

    name: str = "main"
    index: int = 0
    count: int = 1


def worker_of(config: pytest.Config) -> Worker:
    info = getattr(config, "workerinput", None)
    if not info:
        return Worker()
    name = str(info.get("workerid", "gw0"))
    match = re.fullmatch(r"gw(\d+)", name)
    index = int(match.group(1)) if match else 0
    count = int(info.get("workercount") or os.environ.get("PYTEST_XDIST_WORKER_COUNT") or index + 1)
    return Worker(name=name, index=index, count=max(count, index + 1))


def ci_shard(environ: Any = None) -> tuple[int, int]:
    """The CI job's slice of the case space (``--shard auto``'s variables: MLAFUZZ_SHARD,
    Buildkite's BUILDKITE_PARALLEL_JOB/_COUNT), which the items' parts split again."""
    from mlafuzz.harness.drive.campaign import ShardError, shard_from_env

    try:
        k, n, _ = shard_from_env(environ)
    except ShardError as exc:
        raise pytest.UsageError(f"mlafuzz: {exc}") from None
    return k, n


def gpu_for(worker: Worker, device_count: int) -> int:
    """The visible GPU ordinal worker gwN uses: N modulo the GPUs CUDA_VISIBLE_DEVICES exposes."""
    if device_count < 1:
        raise ValueError(f"device_count={device_count} must be >= 1")
    return worker.index % device_count


def impl_label(ref: str) -> str:
    """A node-id- and path-safe label for an impl ref ('torch', 'gather_from_zero.py:gather')."""
    target, sep, attr = ref.rpartition(":")
    short = f"{Path(target).name}:{attr}" if sep and ("/" in target or os.sep in target) else ref
    return re.sub(r"[^A-Za-z0-9_.:=+-]", "_", short)


class FuzzFailure(Exception):
    """An item's unexpected findings; str() is the whole report shown by pytest."""


class FuzzItem(pytest.Item):
    def __init__(self, *, op: str, ref: str, label: str, entry: ImplEntry, part: int, parts: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.op, self.ref, self.label, self.entry = op, ref, label, entry
        self.part, self.parts = part, parts  # part k of W: the xdist workers' count, whichever runs it

    def runtest(self) -> None:
        self.config.pluginmanager.get_plugin(SESSION_PLUGIN).run_item(self)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from mlafuzz.kernels.entry import ImplError

        if isinstance(excinfo.value, (FuzzFailure, ImplError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"mlafuzz fuzz {self.op}={self.ref}"


class FuzzCollector(pytest.Collector):
    def __init__(self, *, specs: list[tuple[str, str, ImplEntry]], parts: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.specs, self.parts = specs, parts

    def collect(self) -> list[pytest.Item]:
        labels = [impl_label(ref) for _, ref, _ in self.specs]
        # Two refs with one short label (same file name, different folders): fall back to the whole ref.
        labels = [
            label if labels.count(label) == 1 else re.sub(r"[^A-Za-z0-9_.:=+-]", "_", ref)
            for label, (_, ref, _) in zip(labels, self.specs)
        ]
        # Every xdist worker collects the same items (xdist requires it) and runs the ones it is
        # handed: one item per part, so every part runs whichever worker takes it.
        w = self.parts
        return [
            FuzzItem.from_parent(
                self,
                name=f"{op}[{label}]" if w == 1 else f"{op}[{label}-part{k}of{w}]",
                op=op,
                ref=ref,
                label=label,
                entry=entry,
                part=k,
                parts=w,
            )
            for label, (op, ref, entry) in zip(labels, self.specs)
            for k in range(w)
        ]


class FuzzSession:
    """The switched-on plugin: resolved implementations, device, ledger; runs items; sums up stale entries."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        budget, cases = config.getoption("mlafuzz_budget"), config.getoption("mlafuzz_cases")
        self.budget = float(budget) if budget is not None else None
        self.cases = int(cases) if cases is not None else None
        if self.budget is not None and not self.budget > 0:
            raise pytest.UsageError(f"--mlafuzz-budget={self.budget} must be > 0 seconds")
        if self.cases is not None and self.cases < 1:
            raise pytest.UsageError(f"--mlafuzz-cases={self.cases} must be >= 1")
        self.seed = int(config.getoption("mlafuzz_seed"))
        self.worker = worker_of(config)
        out = config.getoption("mlafuzz_out")
        self.out_root = Path(out) if out else Path(config.invocation_params.dir) / "mlafuzz-out"
        self.device = self._pick_device(config.getoption("mlafuzz_device"))
        self.ledger = self._load_ledger(config.getoption("mlafuzz_ledger"))
        self.session = self._session()
        self.features = tuple(config.getoption("mlafuzz_features") or ())
        self.specs = self._resolve(config.getoption("mlafuzz_impl") or [])
        self.shrink_budget = float(config.getoption("mlafuzz_shrink_budget"))
        from mlafuzz.harness.drive.campaign import DEFAULT_TIMEOUT

        self.isolate = bool(config.getoption("mlafuzz_isolate"))
        timeout = config.getoption("mlafuzz_timeout")
        if timeout is not None and not timeout > 0:
            raise pytest.UsageError(f"--mlafuzz-timeout={timeout} must be > 0 seconds")
        self.timeout = float(timeout) if timeout is not None else DEFAULT_TIMEOUT
        self._gpu_set = False
        # When the next item's budget starts: the first counts pytest's start (its imports, the
        # implementations' loading), as `mlafuzz fuzz`'s counts the command's; None: its own start.
        self._clock: float | None = LOADED_AT
        self._ran: set[tuple[str, str]] = set()  # (op, impl) of items that reported (controller side)
        self._matched: set[int] = set()  # ledger entry indices some finding matched

    # --- set-up -------------------------------------------------------------

    @staticmethod
    def _pick_device(asked: str | None) -> str:
        from mlafuzz.harness.drive.environment import EnvironmentProblem, default_device, prepare

        device = asked or default_device()
        try:
            prepare(device)  # before any kernel module imports triton
        except EnvironmentProblem as exc:
            raise pytest.UsageError(f"mlafuzz: {exc}") from None
        return device

    @staticmethod
    def _session() -> Session:
        from mlafuzz.harness.check.session import Session
        from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref

        return Session(table=table_from_ref(DEFAULT_TABLE))

    @staticmethod
    def _load_ledger(path: str | None) -> Ledger | None:
        from mlafuzz.harness.ledger import LedgerError, load_ledger

        try:
            return load_ledger(path) if path else None
        except LedgerError as exc:
            raise pytest.UsageError(f"--mlafuzz-ledger: {exc}") from None

    def _resolve(self, texts: list[str]) -> list[tuple[str, str, ImplEntry]]:
        """(op, ref, entry) per item: each --mlafuzz-impl (an op may come more than once: an item
        each), else every op's default here; each resolved and loaded once, as ``mlafuzz fuzz``
        does (drive/campaign.py ``select_impls``), so a mistake is the same one line here."""
        from mlafuzz.harness.drive.campaign import CampaignError, declared_features, select_impls
        from mlafuzz.kernels.entry import ImplError
        from mlafuzz.kernels.registry import parse_impl_arg

        s = self.session
        try:
            pairs = [parse_impl_arg(t, ops=s.table.names) for t in texts] or [
                (op, s.default_ref(op, self.device)) for op in s.table.names
            ]
            pairs = list(dict.fromkeys(pairs))
            features = declared_features(self.features, list(dict.fromkeys(op for op, _ in pairs)))
            for op, ref in pairs:
                select_impls(s, [f"{op}={ref}"], [op], self.device, features=features)
            return [(op, ref, s.entry(op, ref, features=features.get(op, ()))) for op, ref in pairs]
        except (ImplError, CampaignError) as exc:
            raise pytest.UsageError(f"mlafuzz: {exc}") from None

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        """Each item's optional surfaces: what its implementation will and will not be given."""
        from mlafuzz.kernels.external import surface_view
        from mlafuzz.reports import console

        views = (surface_view(entry) for _, _, entry in self.specs)
        return [console.surface_line(v) for v in views if v is not None]

    # --- collection ---------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so it applies to our items too
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        collector = FuzzCollector.from_parent(
            session,
            name="mlafuzz",
            nodeid="mlafuzz",
            path=session.path / "mlafuzz",
            specs=self.specs,
            parts=self.worker.count,
        )
        items.extend(session.genitems(collector))  # emits the collect report, so "collected N items" counts ours

    # --- running ------------------------------------------------------------

    def _device_for_worker(self) -> str:
        if self.device == "cuda" and not self._gpu_set:
            import torch

            # CUDA_VISIBLE_DEVICES is the caller's: choose among what it exposes, never rewrite it.
            torch.cuda.set_device(gpu_for(self.worker, torch.cuda.device_count()))
            self._gpu_set = True
        return self.device

    def item_dir(self, item: FuzzItem) -> Path:
        """The item's run folder: named by its part, not by the worker that took it."""
        which = "main" if item.parts == 1 else f"part{item.part}of{item.parts}"
        return self.out_root / f"{item.op}-{item.label.replace(':', '_')}-{which}"

    def _limit(self) -> str:
        return " / ".join(
            x for x in (f"{self.cases} cases" if self.cases else "", f"{self.budget:g} s" if self.budget else "") if x
        )

    def _slots(self, device: str) -> tuple[str, ...]:
        """The worker's device when items run in a worker process: this xdist worker's GPU."""
        if not self.isolate or device == "cpu":
            return ()
        import torch

        return (f"cuda:{gpu_for(self.worker, torch.cuda.device_count())}",)

    def run_item(self, item: FuzzItem) -> None:
        from mlafuzz.harness.drive.campaign import Campaign, CampaignError, run_campaign
        from mlafuzz.reports import console

        started, self._clock = self._clock or time.monotonic(), None
        device = self._device_for_worker()
        out = self.item_dir(item)
        campaign = Campaign(
            ops=(item.op,),
            impls=(f"{item.op}={item.ref}",),
            device=device,
            budget=self.budget / item.parts if self.budget is not None else None,  # the op's, split
            cases=self.cases,
            seed=self.seed,
            out_dir=out,  # this item's previous run there is replaced, never appended to
            shard=ci_shard(),
            part=(item.part, item.parts),
            shrink_budget=self.shrink_budget,
            features=tuple(t for t in self.features if t.partition("=")[0] == item.op),
            timeout=self.timeout,
            isolate=self.isolate,
            slots=self._slots(device),
            ledger=self.ledger,
        )
        try:
            result = run_campaign(campaign, session=self.session, started=started)
        except CampaignError as exc:  # an impl that can't run here fails the item with one line
            raise FuzzFailure(f"mlafuzz: {exc}") from None
        summary, judgement = result.summary, result.judgement
        if summary.interrupted:
            raise KeyboardInterrupt
        totals = summary.to_json()
        skipped = "".join(f"\n{line}" for line in console.skip_lines(totals))
        item.add_report_section("call", "mlafuzz", f"{console.summary_line(totals)}{skipped}\nfindings: {out}")
        item.user_properties.append(("mlafuzz_item", [item.op, item.ref]))
        if self.ledger is not None:
            item.user_properties.append(("mlafuzz_ledger_matched", list(judgement.matched)))
        if not judgement.passed:
            shard = (result.config.shard.index, result.config.shard.count)  # the part's own: its rerun
            raise self._failure(item, result, device=device, shard=shard, out=out)

    def _failure(self, item: FuzzItem, result: Any, *, device: str, shard: tuple[int, int], out: Path) -> FuzzFailure:
        """The item's report of its unexpected findings: the first buckets, each with its replay."""
        from mlafuzz.reports import console
        from mlafuzz.reports.model import group_buckets

        summary, judgement, found = result.summary, result.judgement, result.found
        failing = set(judgement.failing())
        unexpected = [f for f in found if f.dedup_key in failing]
        expected = [f for f in found if judgement.statuses.get(f.dedup_key) == "expected"]
        buckets = [b for b in group_buckets(unexpected, judgement)]
        bundles = {tuple(b.get("bucket", ())): b.get("replay") for b in summary.bundles if isinstance(b, dict)}
        rerun = console.rerun_command(
            op=item.op,
            impl=item.ref,
            device=self.device,
            seed=self.seed,
            cases=summary.cases + summary.skipped,
            shard=shard,
            out=str(out / "replay"),
            features=tuple(sorted(item.entry.declared)),
        )
        title = (
            f"mlafuzz: {item.op}={item.ref} on {device} (seed {self.seed}, shard {shard[0]}/"
            f"{shard[1]}, {self._limit()}): {len(unexpected)} unexpected findings in"
            f" {console.plural(len(buckets), 'bucket')}"
            + (f", {len(expected)} expected per ledger" if expected else "")
        )
        return FuzzFailure(
            console.plugin_failure(
                title=title,
                summary=summary.to_json(),
                buckets=buckets,
                shown=MAX_BUCKETS_SHOWN,
                replay_for=lambda b: b.first.repro or bundles.get(b.key) or rerun,
                findings_path=str(out / "findings.jsonl"),
                run_dir=str(out),
            )
        )

    # --- summing up (on the controller under xdist; reports carry user_properties) ---

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        if not nodeid.startswith("mlafuzz::"):  # another test runs first: it is not the item's to pay for
            self._clock = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == "mlafuzz_item":
                self._ran.add((value[0], value[1]))
            elif name == "mlafuzz_ledger_matched":
                self._matched.update(value)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.ledger is None or not self._ran:
            return
        from mlafuzz.reports.console import stale_lines

        stale = [e for e in self.ledger.entries if e.index not in self._matched and (e.op, e.impl) in self._ran]
        if stale:
            terminalreporter.section("mlafuzz: stale ledger entries")
            for line in stale_lines(stale):
                terminalreporter.line(line)


def pytest_configure(config: pytest.Config) -> None:
    if (
        config.getoption("mlafuzz_budget", default=None) is None
        and config.getoption("mlafuzz_cases", default=None) is None
    ):
        return  # inactive: plain pytest runs never import torch through us
    config.pluginmanager.register(FuzzSession(config), SESSION_PLUGIN)
