"""The harness proves its power on the catalog of planted bugs (``mlafuzz mutants``).

Each mutant is fuzzed until it draws its expected finding kind, or its budget
(seconds, or cases) runs out; the correct implementations are fuzzed in the
same run and must draw nothing. Each gets its own run folder under ``out``,
cleared first: a catalog run replaces the last one, never appends to it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from mlafuzz.generators.draw import SMALL
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz, shrink_and_bundle
from mlafuzz.harness.drive.workers import Executor
from mlafuzz.reports.rundir import clear_run


@dataclass(frozen=True, kw_only=True)
class MutantResult:
    op: str
    name: str
    expected: str
    killed: bool
    found: tuple[str, ...]
    cases: int
    seconds: float
    size: str


def run_mutants(*, session: Session, ops: list[str], device: str, budget: float | None, cases: int | None,
                out: Path, seed: int, shrink_budget: float, executor: Executor) -> tuple[list[MutantResult], list[str]]:
    """(one result per mutant that runs here, the problems of the correct implementations)."""
    results = []
    kind = device.split(":")[0]
    for entry in session.registry.entries(mutants=True):
        if entry.op not in ops or kind not in entry.devices or entry.missing():
            continue
        expected = entry.expected_kind or ""
        config = FuzzConfig(ops=(entry.op,), impls={entry.op: entry.name}, device=device, budget=budget, cases=cases,
                            seed=seed, out_dir=out / entry.name, knobs=SMALL, shrink_budget=0.0, table=session.table)
        clear_run(config.out_dir)
        start = time.monotonic()
        # The executor (and its warm workers) is shared by every mutant.
        summary = fuzz(config, executor=executor, stop_when=lambda s: expected in s.by_kind)
        seconds = time.monotonic() - start
        size = ""
        if expected in summary.by_kind and shrink_budget > 0:
            summary.buckets = {key: v for key, v in summary.buckets.items() if key[0] == expected}
            shrink_and_bundle(dataclasses.replace(config, shrink_budget=shrink_budget), summary, executor)
            if summary.bundles:
                size = ", ".join(f"{k} {v}" for k, v in summary.bundles[0]["size"].items())
        results.append(MutantResult(op=entry.op, name=entry.name, expected=expected,
                                    killed=expected in summary.by_kind, found=tuple(sorted(summary.by_kind)),
                                    cases=summary.cases, seconds=seconds, size=size))
    # The correct implementations, same run, same budget: they must stay clean.
    clean_problems = []
    for op in ops:
        ref = session.default_ref(op, device)
        config = FuzzConfig(ops=(op,), impls={op: ref}, device=device, budget=budget, cases=cases, seed=seed,
                            out_dir=out / f"correct-{op}", knobs=SMALL, table=session.table)
        clear_run(config.out_dir)
        summary = fuzz(config, executor=executor)
        if summary.findings:
            clean_problems.append(f"{op}={ref}: {summary.findings} findings ({', '.join(sorted(summary.by_kind))})")
    return results, clean_problems
