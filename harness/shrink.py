"""Shrinking a failing case to a small batch that still shows the same finding.

Greedy, Hypothesis-style: each reducer proposes simpler specs (fewer requests,
shorter contexts and queries, fewer blocks, smaller K, simpler values and
layouts); the first proposal on which the same finding (kind, op, cause) still
reproduces is kept and the search restarts from it, until no proposal helps or
the time budget is spent. The seed is kept, so every step is deterministic.
(Hypothesis's own shrinker works on its choice sequence; our fuzz cases come
from a seeded drawer, so we shrink the spec directly, with the same strategy.)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from mlafuzz.generators.spec import (
    ConvertSpec, GatherSpec, Layout, Paging, TopkMode, ValueMode, WsForm, spec_from_dict, spec_to_dict,
)
from mlafuzz.harness.findings import Finding
from mlafuzz.harness.tasks import Task, TaskResult

REDUCERS: dict[type, Callable[[Any], Iterator[Any]]] = {}


def reducer(spec_type: type):
    def register(fn: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        REDUCERS[spec_type] = fn
        return fn
    return register


def _paging_steps(p: Paging) -> Iterator[Paging]:
    if p.spare_blocks:
        yield dataclasses.replace(p, spare_blocks=0)
    if p.extra_table_cols:
        yield dataclasses.replace(p, extra_table_cols=0)
    if p.layout is not Layout.CONTIGUOUS:
        yield dataclasses.replace(p, layout=Layout.CONTIGUOUS)


def _drop_each(items: tuple) -> Iterator[tuple]:
    if len(items) > 1:
        half = len(items) // 2
        yield items[:half]
        yield items[half:]
        for j in range(len(items)):
            yield items[:j] + items[j + 1:]


def _halvings(n: int, floor: int = 0) -> Iterator[int]:
    seen = set()
    for v in (floor, n // 2, n - 1):
        if floor <= v < n and v not in seen:
            seen.add(v)
            yield v


def with_request(spec: Any, j: int, **changes: Any) -> Any:
    """``spec`` with request ``j`` changed (raises SpecError if that is not a valid spec)."""
    reqs = spec.requests
    return dataclasses.replace(spec, requests=reqs[:j] + (dataclasses.replace(reqs[j], **changes),) + reqs[j + 1:])


def _try(make: Callable[[], Any]) -> Iterator[Any]:
    try:
        yield make()
    except ValueError:  # SpecError: that reduction is not a valid spec
        return


@reducer(GatherSpec)
def reduce_gather(s: GatherSpec) -> Iterator[GatherSpec]:
    for reqs in _drop_each(s.requests):
        yield from _try(lambda: dataclasses.replace(s, requests=reqs))
    for j, r in enumerate(s.requests):
        if r.context_len > r.seq_start + r.length:
            yield from _try(lambda: with_request(s, j, context_len=r.seq_start + r.length))
        for v in _halvings(r.length):
            yield from _try(lambda: with_request(s, j, length=v, context_len=r.seq_start + v))
        for v in _halvings(r.seq_start):
            yield from _try(lambda: with_request(s, j, seq_start=v, context_len=v + r.length))
    for p in _paging_steps(s.paging):
        yield dataclasses.replace(s, paging=p)
    if s.ws_form is not WsForm.EXACT:
        yield dataclasses.replace(s, ws_form=WsForm.EXACT)
    if s.values is not ValueMode.ACTIVATIONS:
        yield dataclasses.replace(s, values=ValueMode.ACTIVATIONS)


@reducer(ConvertSpec)
def reduce_convert(s: ConvertSpec) -> Iterator[ConvertSpec]:
    for reqs in _drop_each(s.requests):
        if any(r.num_tokens for r in reqs):
            yield from _try(lambda: dataclasses.replace(s, requests=reqs))
    for j, r in enumerate(s.requests):
        for v in _halvings(r.num_tokens):
            yield from _try(lambda: with_request(s, j, num_tokens=v))
        for v in _halvings(r.seq_len):
            yield from _try(lambda: with_request(s, j, seq_len=v))
        if r.prefill:
            yield from _try(lambda: with_request(s, j, prefill=False))
    if s.prefill_workspace and not any(r.prefill for r in s.requests):
        yield dataclasses.replace(s, prefill_workspace=False)
    if s.topk > s.block_n:
        yield from _try(lambda: dataclasses.replace(s, topk=s.block_n))
    for p in _paging_steps(s.paging):
        yield dataclasses.replace(s, paging=p)
    for mode in (TopkMode.VALID, TopkMode.PADDED):
        if s.topk_mode is not mode:
            yield dataclasses.replace(s, topk_mode=mode)


def size_of(spec: Any) -> dict[str, int]:
    """A few numbers that say how big a case is, for reports."""
    reqs = getattr(spec, "requests", ())
    out = {"requests": len(reqs)} if reqs else {"tokens": getattr(spec, "num_tokens", 0)}
    if isinstance(spec, GatherSpec):
        out["rows"] = sum(r.length for r in reqs)
        out["context"] = max((r.context_len for r in reqs), default=0)
    elif isinstance(spec, ConvertSpec):
        out["rows"] = sum(r.num_tokens for r in reqs)
        out["topk"] = spec.topk
    return out


def same_finding(a: Finding, b: Finding) -> bool:
    return (a.kind, a.op, a.cause) == (b.kind, b.op, b.cause)


@dataclass(frozen=True, kw_only=True)
class ShrinkResult:
    task: Task
    finding: Finding
    attempts: int
    accepted: int
    seconds: float


def shrink(*, task: Task, finding: Finding, evaluate: Callable[[Task], TaskResult],
           budget: float) -> ShrinkResult:
    """The smallest task found within ``budget`` seconds that still shows ``finding``."""
    start = time.monotonic()
    best_task, best_finding = task, finding
    attempts = accepted = 0
    improved = True
    while improved and time.monotonic() - start < budget:
        improved = False
        spec = spec_from_dict(best_task.spec)
        reduce = REDUCERS.get(type(spec))
        if reduce is None:
            break
        for candidate in reduce(spec):
            if time.monotonic() - start >= budget:
                break
            attempts += 1
            trial = dataclasses.replace(best_task, spec=spec_to_dict(candidate))
            result = evaluate(trial)
            match = next((f for f in result.findings if same_finding(f, finding)), None)
            if match is not None:
                best_task, best_finding, improved = trial, match, True
                accepted += 1
                break
    return ShrinkResult(task=best_task, finding=best_finding, attempts=attempts, accepted=accepted,
                        seconds=time.monotonic() - start)


def _register_writer() -> None:
    from mlafuzz.generators.writer import WriterSpec, WriterValues

    @reducer(WriterSpec)
    def reduce_writer(s: WriterSpec) -> Iterator[WriterSpec]:
        for v in _halvings(s.num_tokens):
            yield dataclasses.replace(s, num_tokens=v)
        if s.padding:
            yield dataclasses.replace(s, padding=False)
        for p in _paging_steps(s.paging):
            yield dataclasses.replace(s, paging=p)
        if s.values is not WriterValues.NORMAL:
            yield dataclasses.replace(s, values=WriterValues.NORMAL)


_register_writer()
