"""pytest plugin: fuzz implementations as test items, one per op and implementation.

Inactive unless ``--mlafuzz-budget SECONDS`` is given. Then the session gets
an item per ``--mlafuzz-impl OP=REF`` (repeatable; default: the device's own
implementations), e.g. ``mlafuzz::gather[torch]``. Each item runs the fuzz
loop for the budget and fails with its findings (the first few buckets, each
with its message and replay command); with ``--mlafuzz-ledger FILE`` only
findings the ledger doesn't expect fail, and stale ledger entries are listed
in the terminal summary.

Under pytest-xdist, worker ``gwN`` fuzzes on GPU ``N % device_count`` of the
GPUs the caller made visible, and on shard N of the case space (so workers
never run the same cases). On a machine without CUDA the items run the CPU
implementations with Triton's interpreter. Each item writes its findings to
``OUT/<op>-<impl>-<worker>/`` (``--mlafuzz-out``, default ``./mlafuzz-out``).

This module is loaded by every pytest run once installed (entry point
``pytest11``), so it imports nothing heavy until the plugin is switched on.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mlafuzz.harness.findings import Finding
    from mlafuzz.harness.fuzz import FuzzSummary
    from mlafuzz.harness.ledger import Ledger
    from mlafuzz.kernels.registry import ImplEntry

SESSION_PLUGIN = "mlafuzz-session"
MAX_BUCKETS_SHOWN = 5


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("mlafuzz", "mlafuzz: differential fuzzing of sparse-MLA KV-cache kernels")
    g.addoption("--mlafuzz-budget", type=float, default=None, metavar="SECONDS",
                help="fuzz each op/implementation item for SECONDS (the plugin is off without this)")
    g.addoption("--mlafuzz-impl", action="append", default=[], metavar="OP=REF",
                help="implementation to fuzz (repeatable; an op may appear more than once); "
                     "default: the device's own implementations")
    g.addoption("--mlafuzz-seed", type=int, default=0, metavar="N", help="run seed (default 0)")
    g.addoption("--mlafuzz-out", default=None, metavar="DIR",
                help="findings go to DIR/<op>-<impl>-<worker>/ (default ./mlafuzz-out)")
    g.addoption("--mlafuzz-ledger", default=None, metavar="FILE",
                help="expected-failures ledger (TOML or JSON): only unexpected findings fail")
    g.addoption("--mlafuzz-device", choices=("cpu", "cuda"), default=None,
                help="default: cuda when available, else cpu")
    g.addoption("--mlafuzz-shrink-budget", type=float, default=10.0, metavar="SECONDS",
                help="time to minimize each new finding bucket into a repro bundle (default 10; 0: none)")
    g.addoption("--mlafuzz-isolate", action="store_true",
                help="run cases in a spawned worker process: a crashing or hanging impl becomes a finding"
                     " instead of taking the pytest worker down (slower start)")


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
    def __init__(self, *, op: str, ref: str, label: str, entry: "ImplEntry", **kw: Any) -> None:
        super().__init__(**kw)
        self.op, self.ref, self.label, self.entry = op, ref, label, entry

    def runtest(self) -> None:
        self.config.pluginmanager.get_plugin(SESSION_PLUGIN).run_item(self)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from mlafuzz.kernels.registry import ImplError

        if isinstance(excinfo.value, (FuzzFailure, ImplError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"mlafuzz fuzz {self.op}={self.ref}"


class FuzzCollector(pytest.Collector):
    def __init__(self, *, specs: list[tuple[str, str, "ImplEntry"]], **kw: Any) -> None:
        super().__init__(**kw)
        self.specs = specs

    def collect(self) -> list[pytest.Item]:
        labels = [impl_label(ref) for _, ref, _ in self.specs]
        # Two refs with one short label (same file name, different folders): fall back to the whole ref.
        labels = [label if labels.count(label) == 1 else re.sub(r"[^A-Za-z0-9_.:=+-]", "_", ref)
                  for label, (_, ref, _) in zip(labels, self.specs)]
        return [FuzzItem.from_parent(self, name=f"{op}[{label}]", op=op, ref=ref, label=label, entry=entry)
                for label, (op, ref, entry) in zip(labels, self.specs)]


class FuzzSession:
    """The switched-on plugin: resolved implementations, device, ledger; runs items; sums up stale entries."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.budget = float(config.getoption("mlafuzz_budget"))
        if not self.budget > 0:
            raise pytest.UsageError(f"--mlafuzz-budget={self.budget} must be > 0 seconds")
        self.seed = int(config.getoption("mlafuzz_seed"))
        self.worker = worker_of(config)
        out = config.getoption("mlafuzz_out")
        self.out_root = Path(out) if out else Path(config.invocation_params.dir) / "mlafuzz-out"
        self.device = self._pick_device(config.getoption("mlafuzz_device"))
        self.ledger = self._load_ledger(config.getoption("mlafuzz_ledger"))
        self.specs = self._resolve(config.getoption("mlafuzz_impl") or [])
        self.shrink_budget = float(config.getoption("mlafuzz_shrink_budget"))
        self.isolate = bool(config.getoption("mlafuzz_isolate"))
        self.timeout = 120.0
        self._gpu_set = False
        self._ran: set[tuple[str, str]] = set()  # (op, impl) of items that reported (controller side)
        self._matched: set[int] = set()  # ledger entry indices some finding matched

    # --- set-up -------------------------------------------------------------

    @staticmethod
    def _pick_device(asked: str | None) -> str:
        import torch

        device = asked or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda" and not torch.cuda.is_available():
            raise pytest.UsageError("--mlafuzz-device cuda but no CUDA device is available here")
        if device == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module imports triton
        return device

    @staticmethod
    def _load_ledger(path: str | None) -> "Ledger | None":
        from mlafuzz.harness.ledger import LedgerError, load_ledger

        try:
            return load_ledger(path) if path else None
        except LedgerError as exc:
            raise pytest.UsageError(f"--mlafuzz-ledger: {exc}") from None

    def _resolve(self, texts: list[str]) -> list[tuple[str, str, "ImplEntry"]]:
        from mlafuzz.harness.cli import DEFAULT_IMPLS
        from mlafuzz.harness.ops import fuzzable_ops
        from mlafuzz.kernels.registry import ImplError, parse_impl_arg, resolve

        try:
            pairs = [parse_impl_arg(t) for t in texts] or [
                (op, DEFAULT_IMPLS[self.device][op]) for op in fuzzable_ops() if op in DEFAULT_IMPLS[self.device]]
            fuzzable = fuzzable_ops()
            for op, _ in pairs:
                if op not in fuzzable:
                    raise ImplError(f"--mlafuzz-impl {op}=...: op {op!r} cannot be fuzzed"
                                    f" (fuzzable: {', '.join(fuzzable)})")
            return [(op, ref, resolve(op, ref)) for op, ref in dict.fromkeys(pairs)]
        except ImplError as exc:
            raise pytest.UsageError(f"mlafuzz: {exc}") from None

    # --- collection ---------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so it applies to our items too
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        collector = FuzzCollector.from_parent(session, name="mlafuzz", nodeid="mlafuzz",
                                              path=session.path / "mlafuzz", specs=self.specs)
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
        return self.out_root / f"{item.op}-{item.label.replace(':', '_')}-{self.worker.name}"

    def rerun(self, finding: "Finding", summary: "FuzzSummary", out: Path) -> str:
        """Without a repro bundle: a re-run of exactly this item's cases (case i is a pure function of seed, i)."""
        parts = ["mlafuzz", "fuzz", "--op", finding.op, "--impl", f"{finding.op}={finding.impl}",
                 "--device", self.device, "--seed", str(self.seed), "--cases", str(summary.cases + summary.skipped)]
        if self.worker.count > 1:
            parts += ["--shard", f"{self.worker.index}/{self.worker.count}"]
        parts += ["--out", str(out / "replay")]
        return " ".join(shlex.quote(p) for p in parts)

    def _executor(self, device: str):
        from mlafuzz.harness.workers import InProcess, WorkerPool

        if not self.isolate:
            return InProcess()
        slot = device if device == "cpu" else f"cuda:{gpu_for(self.worker, self._device_count())}"
        return WorkerPool(devices=[slot], timeout=self.timeout)

    @staticmethod
    def _device_count() -> int:
        import torch

        return torch.cuda.device_count()

    def run_item(self, item: FuzzItem) -> None:
        from mlafuzz.harness.findings import Severity
        from mlafuzz.harness.fuzz import FuzzConfig, Shard, fuzz
        from mlafuzz.reports.model import group_buckets

        device = self._device_for_worker()
        item.entry.load(device)  # an impl that can't run here fails the item with one line
        out = self.item_dir(item)
        for stale_file in ("findings.jsonl", "summary.json"):  # this item's previous run, not appended to
            (out / stale_file).unlink(missing_ok=True)
        found: list[Finding] = []
        config = FuzzConfig(ops=(item.op,), impls={item.op: item.ref}, device=device, budget=self.budget,
                            seed=self.seed, out_dir=out, shard=Shard(index=self.worker.index, count=self.worker.count),
                            shrink_budget=self.shrink_budget)
        executor = self._executor(device)
        try:
            summary = fuzz(config, executor=executor, on_finding=found.append)
        finally:
            executor.close()
        if summary.interrupted:
            raise KeyboardInterrupt
        item.add_report_section("call", "mlafuzz", f"{summary.line()}\nfindings: {out}")
        item.user_properties.append(("mlafuzz_item", [item.op, item.ref]))
        errors = [f for f in found if f.severity is Severity.ERROR]
        if self.ledger is not None:
            unexpected, expected = self.ledger.split(errors)
            matched = sorted({e.index for f in found for e in self.ledger.entries if e.matches(f)})
            item.user_properties.append(("mlafuzz_ledger_matched", matched))
        else:
            unexpected, expected = errors, []
        if not unexpected:
            return
        buckets = group_buckets(unexpected)
        bundles = {tuple(b.get("bucket", ())): b.get("replay") for b in summary.bundles if isinstance(b, dict)}
        lines = [f"mlafuzz: {item.op}={item.ref} on {device} (seed {self.seed}, shard {self.worker.index}/"
                 f"{self.worker.count}, {self.budget:g} s): {len(unexpected)} unexpected findings in"
                 f" {len(buckets)} buckets" + (f", {len(expected)} expected per ledger" if expected else ""),
                 summary.line()]
        for b in buckets[:MAX_BUCKETS_SHOWN]:
            f = b.first
            lines += ["", f"{b.kind} cause={b.cause or '-'} ({len(b.findings)} findings), first case {f.case_id}:",
                      f"  {f.message}"]
            lines += [f"  at {list(m.index)}: expected {m.expected}, got {m.actual}" for m in f.mismatches[:3]]
            lines.append(f"  replay: {f.repro or bundles.get(b.key) or self.rerun(f, summary, out)}")
        if len(buckets) > MAX_BUCKETS_SHOWN:
            lines.append(f"... {len(buckets) - MAX_BUCKETS_SHOWN} more buckets")
        lines.append(f"findings: {out / 'findings.jsonl'}  (mlafuzz report {out} --format html -o report.html)")
        raise FuzzFailure("\n".join(lines))

    # --- summing up (on the controller under xdist; reports carry user_properties) ---

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
        from mlafuzz.harness.ledger import format_stale

        stale = [e for e in self.ledger.entries if e.index not in self._matched and (e.op, e.impl) in self._ran]
        if stale:
            terminalreporter.section("mlafuzz: stale ledger entries")
            for line in format_stale(stale):
                terminalreporter.line(line)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("mlafuzz_budget", default=None) is None:
        return  # inactive: plain pytest runs never import torch through us
    config.pluginmanager.register(FuzzSession(config), SESSION_PLUGIN)
