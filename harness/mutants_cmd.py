"""`mlafuzz mutants`: the harness proves its power on the catalog of planted bugs.

Each mutant is fuzzed until it draws its expected finding kind or its budget
runs out; the correct implementations are fuzzed in the same run and must draw
nothing. Exit 1 if any mutant survives or a correct implementation draws a
finding.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path


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


def run_mutants(*, ops: list[str], device: str, budget: float, out: Path, seed: int,
                shrink_budget: float, executor, fuzz_ops: list[str]) -> tuple[list[MutantResult], list[str]]:
    from mlafuzz.generators.draw import SMALL
    from mlafuzz.harness.cli import DEFAULT_IMPLS
    from mlafuzz.harness.fuzz import FuzzConfig, _shrink_and_bundle, fuzz
    from mlafuzz.kernels.registry import REGISTRY, _ensure_builtins

    _ensure_builtins()
    results = []
    for entry in REGISTRY.entries(mutants=True):
        if entry.op not in ops or device not in entry.devices or entry.op not in fuzz_ops:
            continue
        expected = entry.expected_kind or ""
        config = FuzzConfig(ops=(entry.op,), impls={entry.op: entry.name}, device=device, budget=budget, seed=seed,
                            out_dir=out / entry.name, knobs=SMALL, shrink_budget=0.0)
        start = time.monotonic()
        # The executor (and its warm workers) is shared by every mutant.
        summary = fuzz(config, executor=executor, stop_when=lambda s: expected in s.by_kind)
        seconds = time.monotonic() - start
        size = ""
        if expected in summary.by_kind and shrink_budget > 0:
            summary.buckets = {key: v for key, v in summary.buckets.items() if key[0] == expected}
            _shrink_and_bundle(dataclasses.replace(config, shrink_budget=shrink_budget), summary, executor)
            if summary.bundles:
                size = ", ".join(f"{k} {v}" for k, v in summary.bundles[0]["size"].items())
        results.append(MutantResult(op=entry.op, name=entry.name, expected=expected,
                                    killed=expected in summary.by_kind, found=tuple(sorted(summary.by_kind)),
                                    cases=summary.cases, seconds=seconds, size=size))
    # The correct implementations, same run, same budget: they must stay clean.
    clean_problems = []
    for op in ops:
        if op not in fuzz_ops:
            continue
        ref = DEFAULT_IMPLS[device][op]
        config = FuzzConfig(ops=(op,), impls={op: ref}, device=device, budget=budget, seed=seed,
                            out_dir=out / f"correct-{op}", knobs=SMALL)
        summary = fuzz(config, executor=executor)
        if summary.findings:
            clean_problems.append(f"{op}={ref}: {summary.findings} findings ({', '.join(sorted(summary.by_kind))})")
    return results, clean_problems


def render(results: list[MutantResult]) -> list[str]:
    lines = [f"{'mutant':<28} {'expected':<23} {'result':<9} {'kind found':<40} {'cases':>6} {'s':>6}  minimized"]
    for r in results:
        lines.append(f"{r.name:<28} {r.expected:<23} {'killed' if r.killed else 'SURVIVED':<9} "
                     f"{','.join(r.found) or '-':<40} {r.cases:>6} {r.seconds:>6.1f}  {r.size}")
    killed = sum(r.killed for r in results)
    lines.append(f"mutation score: {killed}/{len(results)} killed"
                 f" ({100.0 * killed / len(results) if results else 0:.0f}%)")
    return lines

