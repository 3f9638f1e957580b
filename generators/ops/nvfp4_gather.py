"""The ``nvfp4_gather`` op's inputs (SPEC.md sections 4 and 11.2): vLLM 0.34.0's
``cp_gather_and_upconvert_nvfp4_kv_cache(src_cache, dst, block_table, workspace_starts,
batch_size, seq_starts=None)`` over 352-byte records.

The calls are the fp8_ds_mla gather's (generators/ops/gather.py): the same requests, paging, block
table, call-site views (a column or row slice of the table, dst a row slice of a workspace), ws
forms and error inputs, drawn by its drawer and materialized by its pieces. Only the records
differ (rng/nvfp4_records.py), and the host tier is left out: vLLM's HiSparse tier is fp8-only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import numpy as np
import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Drawer, Knobs
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.ops import gather
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
from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.nvfp4_records import Nvfp4Values, nvfp4_cache
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.spec import Paging, View, WsForm, coerce_enum, coerce_tuple, fail
from mlafuzz.generators.views import table_view

__all__ = ["Nvfp4GatherSpec", "GENERATOR", "Nvfp4Values"]


@dataclass(frozen=True, kw_only=True)
class Nvfp4GatherSpec:
    """An nvfp4_ds_mla gather call (SPEC 11.2, addressed as section 4's gather)."""

    op: ClassVar[str] = "nvfp4_gather"
    requests: tuple[gather.GatherRequest, ...]
    paging: Paging = Paging()
    values: Nvfp4Values = Nvfp4Values.WRITTEN
    ws_form: WsForm = WsForm.EXACT
    pass_seq_starts: bool = True  # False: seq_starts=None (requires every seq_start == 0)
    table_view: View = View.PLAIN
    dst_view: View = View.PLAIN

    def __post_init__(self) -> None:
        coerce_tuple(self, "requests", gather.GatherRequest)
        coerce_enum(self, "values", Nvfp4Values)
        coerce_enum(self, "ws_form", WsForm)
        coerce_enum(self, "table_view", View)
        coerce_enum(self, "dst_view", View)
        if not self.requests:
            fail("Nvfp4GatherSpec", "requests", self.requests, "must hold at least one request")
        if not self.pass_seq_starts and any(r.seq_start for r in self.requests):
            fail("Nvfp4GatherSpec", "pass_seq_starts", False, "but a request has seq_start != 0")
        if self.dst_view is View.COLUMNS:
            fail("Nvfp4GatherSpec", "dst_view", self.dst_view.value, "must be plain or rows")


def draw(d: Drawer, knobs: Knobs) -> Nvfp4GatherSpec:
    """The fp8 gather's call (its drawer, host tier dropped: its chunk-call shape, a row slice of
    the table and no seq_starts, stays), then the scale class: one case in four unwritten."""
    g = gather.draw(d, knobs)
    return Nvfp4GatherSpec(
        requests=g.requests,
        paging=g.paging,
        values=Nvfp4Values.UNWRITTEN if d.integer(0, 3) == 0 else Nvfp4Values.WRITTEN,
        ws_form=g.ws_form,
        pass_seq_starts=g.pass_seq_starts,
        table_view=g.table_view,
        dst_view=g.dst_view,
    )


def materialize(spec: Nvfp4GatherSpec, *, seed: int, device: str) -> Case:
    """The call's tensors on ``device``, laid out as gather.materialize lays out the fp8 gather's
    (only the blocks a call reads hold records; blocks below paging.base_block are zeros)."""
    draws = Draws(seed, "nvfp4_gather")
    bs, base = spec.paging.block_size, spec.paging.base_block
    ctx, seq_start, length = np.array([(r.context_len, r.seq_start, r.length) for r in spec.requests], dtype=np.int64).T
    reads = length > 0
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
    cache = nvfp4_cache(
        Stream(int(seed), "nvfp4_gather/cache"),
        spec.values,
        pool_blocks=plan.pool,
        block_size=bs,
        base_block=base,
        device=device,
    )
    table = table_view(table, spec.table_view, draws=draws.child("table-view"), num_blocks=base + plan.pool)
    params = {"batch_size": len(spec.requests), "total": int(starts[-1])}
    if spec.dst_view is View.ROWS:
        pick = draws.host_int(9)
        params.update(dst_rows_before=gather.DST_ROWS_BEFORE[pick % 3], dst_rows_after=gather.DST_ROWS_AFTER[pick // 3])
    return Case(
        op="nvfp4_gather",
        spec=spec,
        seed=int(seed),
        device=str(torch.device(device)),
        tensors={
            "src_cache": cache,
            "block_table": table,
            "workspace_starts": ws_dev,
            "seq_starts": seq_starts if spec.pass_seq_starts else None,
        },
        params=params,
        zero_blocks={"src_cache": base} if base else {},
    )


def features(spec: Nvfp4GatherSpec) -> set[str]:
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


def size(spec: Nvfp4GatherSpec) -> dict[str, int]:
    return {
        "requests": len(spec.requests),
        "rows": sum(r.length for r in spec.requests),
        "context": max((r.context_len for r in spec.requests), default=0),
    }


def reduce(s: Nvfp4GatherSpec) -> Iterator[Nvfp4GatherSpec]:
    """The fp8 gather's steps (fewer requests, shorter rows, plainer paging and views), then the
    written class, where every element is judged bit for bit."""
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
    if s.values is not Nvfp4Values.WRITTEN:
        yield dataclasses.replace(s, values=Nvfp4Values.WRITTEN)


def needs(case: Case) -> frozenset[str]:
    """A non-zero seq_starts (vLLM's stored kernel @03b6016490 takes no seq_starts; 0.34.0's does)."""
    starts = case.tensors["seq_starts"]
    return frozenset({"seq_starts"}) if starts is not None and bool((starts != 0).any()) else frozenset()


# The fp8 gather's error inputs, its host tier's left out (nvfp4 has none).
INVALID = tuple(k for k in gather.INVALID if k not in gather.HOST_INVALID)

GENERATOR = Generator(
    spec_type=Nvfp4GatherSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=size,
    reduce=reduce,
    invalid=INVALID,
)
