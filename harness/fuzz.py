"""The in-process fuzz loop: draw, materialize, run, compare, record.

Case i of a run is a pure function of (seed, i): its op, its spec and its
tensors. That makes a run reproducible from its seed and lets ``--shard K/N``
split the case space into disjoint, deterministic slices.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from mlafuzz.generators.draw import Knobs, draw_spec
from mlafuzz.generators.materialize import materialize
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.compare import Policy
from mlafuzz.harness.contracts import check_contract, classes_for
from mlafuzz.harness.findings import Finding, Severity
from mlafuzz.harness.runner import CaseResult, run_case
from mlafuzz.kernels.registry import ImplEntry
from mlafuzz.reports.jsonl import FINDINGS_FILE, JsonlSink

MAX_LINES_PER_BUCKET = 50  # a broken impl fails every case; keep the file readable


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

    def owns(self, i: int) -> bool:
        return i % self.count == self.index


@dataclass(frozen=True, kw_only=True)
class FuzzConfig:
    ops: tuple[str, ...]
    impls: Mapping[str, ImplEntry]
    device: str = "cpu"
    cases: int | None = None  # per run (this shard), None = until the budget
    budget: float | None = None  # seconds
    seed: int = 0
    out_dir: Path = Path("mlafuzz-out")
    knobs: Knobs = Knobs()
    policy: Policy = Policy()
    fixed_spec: Any | None = None  # run this spec with varying seeds instead of drawing
    shard: Shard = Shard()
    quiet: bool = False
    rerun_every: int = 4  # every Nth case runs twice, compared bit for bit (NONDETERMINISM)
    contract_every: int = 3  # every Nth case also runs one error-input class (ACCEPTED_INVALID_INPUT)

    def __post_init__(self) -> None:
        if self.cases is None and self.budget is None:
            raise ValueError("FuzzConfig: give cases=N or budget=SECONDS (or both)")
        missing = [op for op in self.ops if op not in self.impls]
        if missing:
            raise ValueError(f"FuzzConfig: ops={missing!r} have no implementation selected")


@dataclass(kw_only=True)
class FuzzSummary:
    cases: int = 0
    skipped: int = 0
    per_op: collections.Counter = field(default_factory=collections.Counter)
    by_kind: collections.Counter = field(default_factory=collections.Counter)
    findings: int = 0  # error-severity findings
    infos: int = 0
    buckets: set = field(default_factory=set)
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def rate(self) -> float:
        return self.cases / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        ops = ", ".join(f"{op} {n}" for op, n in sorted(self.per_op.items()))
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items()))
        return (f"mlafuzz: {self.cases} cases ({ops or 'none'}), {self.findings} findings"
                f"{' (' + kinds + ')' if kinds else ''} in {len(self.buckets)} buckets, {self.skipped} skipped,"
                f" {self.seconds:.1f} s ({self.rate:.1f} cases/s){' [interrupted]' if self.interrupted else ''}")

    def to_json(self) -> dict[str, Any]:
        return {"cases": self.cases, "skipped": self.skipped, "per_op": dict(self.per_op),
                "by_kind": dict(self.by_kind), "findings": self.findings, "infos": self.infos,
                "buckets": len(self.buckets), "seconds": round(self.seconds, 3),
                "cases_per_second": round(self.rate, 3), "interrupted": self.interrupted}


def _record(summary: FuzzSummary, sink: JsonlSink, result: CaseResult, per_bucket: collections.Counter) -> None:
    for f in result.findings:
        if f.severity is Severity.ERROR:
            summary.findings += 1
            summary.by_kind[f.kind.value] += 1
            summary.buckets.add(f.dedup_key)
        else:
            summary.infos += 1
        per_bucket[f.dedup_key] += 1
        if per_bucket[f.dedup_key] <= MAX_LINES_PER_BUCKET:
            sink.write(f.to_json())


def fuzz(config: FuzzConfig, *, on_finding: Callable[[Finding], None] | None = None,
         log: Callable[[str], None] | None = None) -> FuzzSummary:
    """Run the loop until ``config.cases`` or ``config.budget``; findings go to out_dir/findings.jsonl."""
    log = log or (lambda msg: None if config.quiet else print(msg, file=sys.stderr, flush=True))
    config.out_dir.mkdir(parents=True, exist_ok=True)
    summary = FuzzSummary()
    per_bucket: collections.Counter = collections.Counter()
    start = last_log = time.monotonic()
    index = 0
    with JsonlSink(config.out_dir / FINDINGS_FILE) as sink:
        try:
            while True:
                elapsed = time.monotonic() - start
                if config.cases is not None and summary.cases + summary.skipped >= config.cases:
                    break
                if config.budget is not None and elapsed >= config.budget:
                    break
                i, index = index, index + 1
                if not config.shard.owns(i):
                    continue
                op = config.ops[i % len(config.ops)]
                seed = case_seed(config.seed, op, i)
                spec = config.fixed_spec if config.fixed_spec is not None else draw_spec(
                    op, seed=seed, knobs=config.knobs)
                case = materialize(spec, seed, config.device)
                entry = config.impls[op]
                result = run_case(case=case, entry=entry, policy=config.policy,
                                  rerun=i % config.rerun_every == 0)
                classes = classes_for(op)
                if not result.skipped and classes and i % config.contract_every == 1:
                    klass = classes[(i // config.contract_every) % len(classes)]
                    extra = check_contract(case=case, entry=entry, fn=entry.load(config.device), klass=klass)
                    result = dataclasses.replace(result, findings=result.findings + tuple(
                        dataclasses.replace(f, seed=seed, spec=spec_to_dict(spec)) for f in extra))
                if result.skipped:
                    summary.skipped += 1
                    continue
                summary.cases += 1
                summary.per_op[op] += 1
                _record(summary, sink, result, per_bucket)
                for f in result.findings:
                    if on_finding:
                        on_finding(f)
                if time.monotonic() - last_log > 5.0:
                    last_log = time.monotonic()
                    summary.seconds = last_log - start
                    log(f"  ... {summary.line()}")
        except KeyboardInterrupt:
            summary.interrupted = True
    summary.seconds = time.monotonic() - start
    (config.out_dir / "summary.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    return summary
