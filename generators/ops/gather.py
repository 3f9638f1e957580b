"""The ``gather`` op's inputs (SPEC.md section 4): spec, drawer, materializer, features, shrink
steps and error-input classes. The op table (harness/ops) wires them to the oracle and the call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import numpy as np
import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Drawer, Knobs, draw_paging, draw_view, sized, tile_total
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.invalid import InvalidClass, with_
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
from mlafuzz.generators.rng.records import paged_cache
from mlafuzz.generators.spec import Paging, ValueMode, View, WsForm, check_int, coerce_enum, coerce_tuple, fail
from mlafuzz.generators.views import table_view


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


@dataclass(frozen=True, kw_only=True)
class GatherSpec:
    """A gather call (SPEC section 4)."""

    op: ClassVar[str] = "gather"
    requests: tuple[GatherRequest, ...]
    paging: Paging = Paging()
    values: ValueMode = ValueMode.ACTIVATIONS
    ws_form: WsForm = WsForm.EXACT
    pass_seq_starts: bool = True  # False: seq_starts=None (requires every seq_start == 0)
    table_view: View = View.PLAIN  # block_table a column or row slice of a larger table (SPEC 8)
    dst_view: View = View.PLAIN  # ROWS: dst rows of a larger workspace the harness guards (SPEC 8)

    def __post_init__(self) -> None:
        coerce_tuple(self, "requests", GatherRequest)
        coerce_enum(self, "values", ValueMode)
        coerce_enum(self, "ws_form", WsForm)
        coerce_enum(self, "table_view", View)
        coerce_enum(self, "dst_view", View)
        if not self.requests:
            fail("GatherSpec", "requests", self.requests, "must hold at least one request")
        if not self.pass_seq_starts and any(r.seq_start for r in self.requests):
            fail("GatherSpec", "pass_seq_starts", False, "but a request has seq_start != 0")
        if self.dst_view is View.COLUMNS:
            fail("GatherSpec", "dst_view", self.dst_view.value, "must be plain or rows")


# --- drawing ---------------------------------------------------------------


def draw(d: Drawer, knobs: Knobs) -> GatherSpec:
    """A chunked-context gather (SPEC 5.2): contexts up to max_seq_len, each request reading one chunk
    of it; the rows read in all (dst) at most max_rows, their blocks at most max_records records."""
    pass_seq_starts = not d.boolean()
    n = sized(d, knobs, 1, knobs.max_requests, tiles=knobs.row_tiles)
    paging = draw_paging(d, knobs)
    bs = paging.block_size
    max_ctx = max(0, min(knobs.max_seq_len, (knobs.max_table // n - paging.extra_table_cols) * bs))
    rows_left = min(knobs.max_rows, max(0, knobs.max_records - n * bs))  # a chunk's blocks: rows / bs + 1
    requests = []
    for _ in range(n):
        ctx = sized(d, knobs, 0, max_ctx)
        start = sized(d, knobs, 0, ctx) if pass_seq_starts else 0
        length = sized(d, knobs, 0, min(ctx - start, rows_left), tiles=knobs.row_tiles)
        rows_left -= length
        requests.append(GatherRequest(context_len=ctx, seq_start=start, length=length))
    total = sum(r.length for r in requests)
    last = requests[-1]
    target = tile_total(
        d, knobs, total, hi=min(knobs.max_rows, total + last.context_len - last.seq_start - last.length)
    )
    if target != total and 0 <= last.length + target - total <= last.context_len - last.seq_start:
        requests[-1] = dataclasses.replace(last, length=last.length + target - total)
    return GatherSpec(
        requests=tuple(requests),
        paging=paging,
        values=d.choice(list(ValueMode)),
        ws_form=d.choice(list(WsForm)),
        pass_seq_starts=pass_seq_starts,
        table_view=draw_view(d, knobs, (View.COLUMNS, View.ROWS)),
        dst_view=draw_view(d, knobs, (View.ROWS,)),
    )


# --- materializing -----------------------------------------------------------


def materialize(spec: GatherSpec, *, seed: int, device: str) -> Case:
    """The call's tensors on ``device``. Only the blocks a call reads hold records (blocks of the rows
    [seq_start, seq_start + length) of each request, plus spares); a request's other table columns
    hold ids of those (block_table's ``live``); blocks below paging.base_block are zeros
    (``Case.zero_blocks``). With dst_view ROWS, params say how many workspace rows lie before and
    after dst (the harness allocates and guards the workspace)."""
    draws = Draws(seed, "gather")
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
    cache = paged_cache(
        draws.child("cache"), spec.values, pool_blocks=plan.pool, block_size=bs, base_block=base, device=device
    )
    table = table_view(table, spec.table_view, draws=draws.child("table-view"), num_blocks=base + plan.pool)
    tensors = {
        "src_cache": cache,
        "block_table": table,
        "workspace_starts": ws_dev,
        "seq_starts": seq_starts if spec.pass_seq_starts else None,
    }
    params = {"batch_size": len(spec.requests), "total": int(starts[-1])}
    if spec.dst_view is View.ROWS:
        pick = draws.host_int(9)
        params.update(dst_rows_before=DST_ROWS_BEFORE[pick % 3], dst_rows_after=DST_ROWS_AFTER[pick // 3])
    return Case(
        op="gather",
        spec=spec,
        seed=int(seed),
        device=str(torch.device(device)),
        tensors=tensors,
        params=params,
        zero_blocks={"src_cache": base} if base else {},
    )


# Workspace rows around a dst row slice: few layouts (the fast path caches a fingerprint of each
# guard-zone layout), from one row to a few hundred KB.
DST_ROWS_BEFORE = (1, 8, 200)
DST_ROWS_AFTER = (0, 3, 64)


# --- features, size, shrinking -------------------------------------------------


def features(spec: GatherSpec) -> set[str]:
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


def size(spec: GatherSpec) -> dict[str, int]:
    return {
        "requests": len(spec.requests),
        "rows": sum(r.length for r in spec.requests),
        "context": max((r.context_len for r in spec.requests), default=0),
    }


def reduce(s: GatherSpec) -> Iterator[GatherSpec]:
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
    if s.values is not ValueMode.ACTIVATIONS:
        yield dataclasses.replace(s, values=ValueMode.ACTIVATIONS)


def needs(case: Case) -> frozenset[str]:
    """Optional implementation capabilities this case calls for (non-zero seq_starts)."""
    starts = case.tensors["seq_starts"]
    return frozenset({"seq_starts"}) if starts is not None and bool((starts != 0).any()) else frozenset()


# --- error inputs (SPEC section 4: preconditions and host-side checks) ---


def _gather_wrong_dtype(case: Case) -> Case | None:
    return with_(case, params={"dst_dtype": "float32"})


def _gather_wrong_shape(case: Case) -> Case | None:
    return with_(case, params={"dst_cols": 575})


def _device_mismatch(case: Case) -> Case | None:
    if not case.device.startswith("cuda"):
        return None
    return with_(case, tensors={"block_table": case.tensors["block_table"].cpu()})


def _ws(case: Case) -> torch.Tensor:
    return case.tensors["workspace_starts"]


def _ws0_nonzero(case: Case) -> Case | None:
    return with_(case, tensors={"workspace_starts": _ws(case) + 1}, params={"total": case.params["total"] + 1})


def _ws_decreasing(case: Case) -> Case | None:
    b = case.params["batch_size"]
    if b < 3:  # ws[0] must stay 0, so a drop needs ws[1] > ws[2]
        return None
    ws = _ws(case).clone()
    ws[1] = ws[b - 1] + 1
    return with_(case, tensors={"workspace_starts": ws}, params={"total": max(case.params["total"], int(ws[1]))})


def _ws_past_total(case: Case) -> Case | None:
    b = case.params["batch_size"]
    ws = _ws(case).clone()
    ws[b - 1] = case.params["total"] + 1  # dst too small for where the last request starts
    ws[:b] = torch.cummax(ws[:b], 0).values
    return with_(case, tensors={"workspace_starts": ws})


def _block_index_past_table(case: Case) -> Case | None:
    starts = case.tensors["seq_starts"]
    if starts is None or case.params["total"] == 0:
        return None
    width = case.tensors["block_table"].shape[1]
    bs = case.tensors["src_cache"].shape[1]
    return with_(case, tensors={"seq_starts": starts + width * bs})


def _block_id_past_cache(case: Case) -> Case | None:
    if case.params["total"] == 0:
        return None
    table = case.tensors["block_table"].clone()
    table.fill_(case.tensors["src_cache"].shape[0] + 7)
    return with_(case, tensors={"block_table": table})


def _negative_seq_start(case: Case) -> Case | None:
    starts = case.tensors["seq_starts"]
    if starts is None or case.params["total"] == 0:
        return None
    return with_(case, tensors={"seq_starts": starts - (starts.max() + 1)})


INVALID: tuple[InvalidClass, ...] = (
    InvalidClass(
        name="wrong_dtype", memory_safe=True, make=_gather_wrong_dtype, description="dst is float32, not bf16"
    ),
    InvalidClass(
        name="wrong_shape", memory_safe=False, make=_gather_wrong_shape, description="dst has 575 columns, not 576"
    ),
    InvalidClass(
        name="device_mismatch",
        memory_safe=False,
        make=_device_mismatch,
        description="block_table on the CPU, the rest on the GPU",
    ),
    InvalidClass(name="ws0_nonzero", memory_safe=True, make=_ws0_nonzero, description="workspace_starts[0] != 0"),
    InvalidClass(
        name="ws_decreasing", memory_safe=False, make=_ws_decreasing, description="workspace_starts decreases"
    ),
    InvalidClass(
        name="ws_past_total",
        memory_safe=False,
        make=_ws_past_total,
        description="workspace_starts[B-1] > dst rows (dst too small)",
    ),
    InvalidClass(
        name="block_index_past_table",
        memory_safe=False,
        make=_block_index_past_table,
        description="(seq_start + len - 1) // bs >= block table width",
    ),
    InvalidClass(
        name="block_id_past_cache", memory_safe=False, make=_block_id_past_cache, description="a block id >= num_blocks"
    ),
    InvalidClass(
        name="negative_seq_start", memory_safe=False, make=_negative_seq_start, description="a negative seq_start"
    ),
)


GENERATOR = Generator(
    spec_type=GatherSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=size,
    reduce=reduce,
    invalid=INVALID,
)
