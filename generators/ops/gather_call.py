"""The paged gather call (SPEC.md section 4) whatever its records: what the fp8_ds_mla gather
(gather.py) and the nvfp4_ds_mla one (nvfp4_gather.py) share. Its requests, paging, call-site
views and ws form are checked, materialized, described and shrunk here once; each op adds its
records (a cache builder and a values class) and, for the fp8 one, its host tier.

A case's streams are named by its op (``Draws(seed, spec.op)``), so the two ops' cases of one
seed are independent, and each is the pure function of its seed it was before this module.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from mlafuzz.generators.case import Case, paged_case
from mlafuzz.generators.reduce import (
    attempt,
    drop_each,
    halvings,
    paging_steps,
    view_features,
    view_steps,
    with_request,
)
from mlafuzz.generators.rng.fill import block_table, plan_table, upload
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.spec import View, WsForm, check_int, coerce_enum, coerce_tuple, fail
from mlafuzz.generators.views import table_view

__all__ = [
    "GatherRequest",
    "DST_ROWS_BEFORE",
    "DST_ROWS_AFTER",
    "check",
    "materialize",
    "features",
    "size",
    "reduce",
    "needs",
]


@dataclass(frozen=True, kw_only=True)
class GatherRequest:
    """A gather request: the context it holds and the slice [seq_start, seq_start+length) read."""

    context_len: int
    seq_start: int = 0
    length: int = 0

    def __post_init__(self) -> None:
        check_int("GatherRequest", "context_len", self.context_len, lo=0, hi=1 << 24)
        check_int("GatherRequest", "seq_start", self.seq_start, lo=0, hi=1 << 24)
        check_int("GatherRequest", "length", self.length, lo=0, hi=1 << 24)
        if self.seq_start + self.length > self.context_len:
            fail(
                "GatherRequest",
                "length",
                self.length,
                f"reads past context_len={self.context_len} from seq_start={self.seq_start}",
            )


def check(spec: Any, values: type[enum.Enum]) -> None:
    """A gather spec's ``__post_init__``: its call's fields coerced (``values`` to the op's values
    class) and checked, the messages naming the spec's class."""
    owner = type(spec).__name__
    coerce_tuple(spec, "requests", GatherRequest)
    coerce_enum(spec, "values", values)
    coerce_enum(spec, "ws_form", WsForm)
    coerce_enum(spec, "table_view", View)
    coerce_enum(spec, "dst_view", View)
    if not spec.requests:
        fail(owner, "requests", spec.requests, "must hold at least one request")
    if not spec.pass_seq_starts and any(r.seq_start for r in spec.requests):
        fail(owner, "pass_seq_starts", False, "but a request has seq_start != 0")
    if spec.dst_view is View.COLUMNS:
        fail(owner, "dst_view", spec.dst_view.value, "must be plain or rows")


# Workspace rows around a dst row slice: few layouts (the fast path caches a fingerprint of each
# guard-zone layout), from one row to a few hundred KB.
DST_ROWS_BEFORE = (1, 8, 200)
DST_ROWS_AFTER = (0, 3, 64)

# (draws, values, *, pool_blocks, block_size, base_block, device) -> the paged cache, uint8
# [base_block + pool_blocks, block_size, record_bytes]: rng/records.py's ``paged_cache`` is one.
CacheBuilder = Callable[..., torch.Tensor]


def materialize(
    spec: Any,
    *,
    seed: int,
    device: str,
    cache: CacheBuilder,
    extra: Callable[[Draws, int], dict[str, torch.Tensor]] | None = None,
) -> Case:
    """The call's tensors on ``device``. Only the blocks a call reads hold records (blocks of the rows
    [seq_start, seq_start + length) of each request, plus spares), made by ``cache`` from the case's
    "cache" stream; a request's other table columns hold ids of those (block_table's ``live``);
    blocks below paging.base_block are zeros (``Case.zero_blocks``). ``extra(draws, num_blocks)``
    adds an op's own tensors (the fp8 gather's host tier). With dst_view ROWS, params say how many
    workspace rows lie before and after dst (the harness allocates and guards the workspace)."""
    draws = Draws(seed, spec.op)
    bs, base = spec.paging.block_size, spec.paging.base_block
    # The requests' numbers as columns (numpy: vector ops, not a Python loop per request).
    ctx, seq_start, length = np.array([(r.context_len, r.seq_start, r.length) for r in spec.requests], dtype=np.int64).T
    reads = length > 0  # a request that reads nothing has no live column (lo > hi)
    live = np.stack([np.where(reads, seq_start // bs, 1), np.where(reads, (seq_start + length - 1) // bs, 0)], axis=1)
    plan = plan_table(
        need=(ctx + bs - 1) // bs,
        layout=spec.paging.layout,
        spare_blocks=spec.paging.spare_blocks,
        extra_cols=spec.paging.extra_table_cols,
        base_block=base,
        live=live,
    )
    starts = np.concatenate([[0], np.cumsum(length)])
    ws = starts if spec.ws_form is WsForm.CUMULATIVE else starts[:-1]
    table_rows, ws_dev, seq_starts = upload(plan.rows, ws, seq_start, device=device)
    table = block_table(draws.child("table"), plan, rows=table_rows, device=device)
    src = cache(draws.child("cache"), spec.values, pool_blocks=plan.pool, block_size=bs, base_block=base, device=device)
    table = table_view(table, spec.table_view, draws=draws.child("table-view"), num_blocks=base + plan.pool)
    tensors = {
        "src_cache": src,
        "block_table": table,
        "workspace_starts": ws_dev,
        "seq_starts": seq_starts if spec.pass_seq_starts else None,
    }
    if extra is not None:
        tensors.update(extra(draws, base + plan.pool))
    params = {"batch_size": len(spec.requests), "total": int(starts[-1])}
    if spec.dst_view is View.ROWS:
        pick = draws.host_int(9)
        params.update(dst_rows_before=DST_ROWS_BEFORE[pick % 3], dst_rows_after=DST_ROWS_AFTER[pick // 3])
    return paged_case(spec, seed=seed, device=device, tensors=tensors, params=params, cache="src_cache")


def features(spec: Any) -> set[str]:
    """The call's coverage features: values class, paging, ws form, request shapes, views."""
    bs = spec.paging.block_size
    out = {f"values:{spec.values.value}", f"layout:{spec.paging.layout.value}", f"ws:{spec.ws_form.value}"}
    if any(r.length == 0 for r in spec.requests):
        out.add("empty-request")
    if any(r.seq_start > 0 for r in spec.requests):
        out.add("seq_starts")
    if any(r.length and (r.seq_start // bs) != ((r.seq_start + r.length - 1) // bs) for r in spec.requests):
        out.add("block-boundary")
    if sum(r.length for r in spec.requests) == 0:
        out.add("total==0")
    return out | view_features(spec.paging, table=spec.table_view, dst=spec.dst_view)


def size(spec: Any) -> dict[str, int]:
    return {
        "requests": len(spec.requests),
        "rows": sum(r.length for r in spec.requests),
        "context": max((r.context_len for r in spec.requests), default=0),
    }


def reduce(s: Any) -> Iterator[Any]:
    """Fewer requests, shorter rows, plainer paging, views and ws form, then the spec's default
    values class (the plainest: activations for fp8_ds_mla, the written class for nvfp4_ds_mla)."""
    for reqs in drop_each(s.requests):
        yield from attempt(lambda: dataclasses.replace(s, requests=reqs))
    for j, r in enumerate(s.requests):
        if r.context_len > r.seq_start + r.length:
            yield from attempt(lambda: with_request(s, j, context_len=r.seq_start + r.length))
        for v in halvings(r.length):
            yield from attempt(lambda: with_request(s, j, length=v, context_len=r.seq_start + v))
        for v in halvings(r.seq_start):
            yield from attempt(lambda: with_request(s, j, seq_start=v, context_len=v + r.length))
    for p in paging_steps(s.paging):
        yield dataclasses.replace(s, paging=p)
    yield from view_steps(s, "table_view", "dst_view")
    if s.ws_form is not WsForm.EXACT:
        yield dataclasses.replace(s, ws_form=WsForm.EXACT)
    plain = next(f.default for f in dataclasses.fields(s) if f.name == "values")
    if s.values is not plain:
        yield dataclasses.replace(s, values=plain)


def needs(case: Case) -> frozenset[str]:
    """A non-zero seq_starts, an optional capability (vLLM's stored nvfp4 kernel @03b6016490 takes
    no seq_starts; 0.34.0's does)."""
    starts = case.tensors["seq_starts"]
    return frozenset({"seq_starts"}) if starts is not None and bool((starts != 0).any()) else frozenset()
