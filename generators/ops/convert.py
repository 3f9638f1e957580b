"""The ``convert`` op's inputs (SPEC.md section 3): spec, drawer, materializer, features, shrink
steps and error-input classes. The op table (harness/ops) wires them to the oracle and the call.

SPEC section 7's options (a block stride in rows, compact-to-front output) are optional
capabilities of an implementation. The drawer draws them for every case; ``fit`` takes out what
an implementation lacks before the case is built (the harness calls it with the implementation's
capabilities: the drawer cannot see them), and ``needs`` says what a given spec needs, so a
spec given whole to an implementation without it is a counted skip, never a false finding.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import numpy as np
import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Deployment, Drawer, Knobs, draw_paging, sized, table_width, tile_total
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.invalid import InvalidClass, with_
from mlafuzz.generators.ops import convert_releases as releases
from mlafuzz.generators.ops.convert_releases import ConvertDcp, IdxMapping
from mlafuzz.generators.reduce import (
    attempt,
    drop_each,
    halvings,
    paging_steps,
    to_defaults,
    view_features,
    view_steps,
    with_request,
)
from mlafuzz.generators.rng.batch import convert_batch
from mlafuzz.generators.rng.fill import TablePlan, plan_table
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.spec import (
    Paging,
    TopkMode,
    View,
    check_int,
    check_topk_tiling,
    coerce_enum,
    coerce_tuple,
    fail,
)
from mlafuzz.generators.views import slack, table_view


@dataclass(frozen=True, kw_only=True)
class ConvertRequest:
    """A request as the convert kernel sees it: its length and its query rows."""

    seq_len: int  # tokens the request holds (context + this step's query)
    num_tokens: int  # query rows of this request in token_indices
    prefill: bool = False  # rows use the prefill workspace (HAS_PREFILL_WORKSPACE)

    def __post_init__(self) -> None:
        check_int("ConvertRequest", "seq_len", self.seq_len, lo=0, hi=1 << 24)
        check_int("ConvertRequest", "num_tokens", self.num_tokens, lo=0, hi=1 << 20)


@dataclass(frozen=True, kw_only=True)
class CallerOut:
    """SPEC 9.2: ``out`` / ``valid_counts_out`` given by the caller as row slices of persistent
    buffers (vLLM passes ``phys_buf[:N]``, never pre-filled). The harness fills the buffers with
    its two byte patterns (neither -1 nor any slot in both runs) and guards the rows around."""

    rows_before: int = 0  # buffer rows before the slice (vLLM slices from row 0; a write at row -1 lands here)
    rows_after: int = 0  # buffer rows after the slice: the call must not write them
    steps: int = 1  # calls in a row through the same buffers; 2: the first step's values must not survive

    def __post_init__(self) -> None:
        check_int("CallerOut", "rows_before", self.rows_before, lo=0, hi=1 << 16)
        check_int("CallerOut", "rows_after", self.rows_after, lo=0, hi=1 << 16)
        check_int("CallerOut", "steps", self.steps, lo=1, hi=2)


@dataclass(frozen=True, kw_only=True)
class ConvertSpec:
    """A convert call (SPEC section 3)."""

    op: ClassVar[str] = "convert"
    requests: tuple[ConvertRequest, ...]
    paging: Paging = Paging()
    topk: int = 128  # NUM_TOPK_TOKENS (K)
    block_n: int = 128  # BLOCK_N; K must be a multiple of it
    topk_mode: TopkMode = TopkMode.PADDED
    prefill_workspace: bool = False
    return_valid_counts: bool = True
    table_view: View = View.PLAIN  # block_table a column or row slice of a larger table (SPEC 8)
    rows_view: View = View.PLAIN  # ROWS: req_id and token_indices rows of the whole step's tensors (SPEC 5.4)
    block_stride_rows: int | None = None  # SPEC 7 BLOCK_STRIDE_ROWS: rows per block slot (None: not passed)
    compact: bool = False  # SPEC 7 COMPACT_TO_FRONT: valid slots packed at each row's front
    caller_out: CallerOut | None = None  # SPEC 9.2: out= / valid_counts_out= given (None: not passed)
    idx_mapping: IdxMapping | None = None  # SPEC 10 (vLLM 0.33.0): rows read the table through a mapping
    dcp: ConvertDcp | None = None  # SPEC 10 (vLLM 0.30.0): the plain convert's DCP arguments

    def __post_init__(self) -> None:
        coerce_tuple(self, "requests", ConvertRequest)
        coerce_enum(self, "topk_mode", TopkMode)
        coerce_enum(self, "table_view", View)
        coerce_enum(self, "rows_view", View)
        if self.block_stride_rows is not None:
            check_int("ConvertSpec", "block_stride_rows", self.block_stride_rows, lo=1, hi=1 << 20)
        if not self.requests:
            fail("ConvertSpec", "requests", self.requests, "must hold at least one request")
        check_topk_tiling("ConvertSpec", topk=self.topk, block_n=self.block_n)
        if self.prefill_workspace is False and any(r.prefill for r in self.requests):
            fail("ConvertSpec", "prefill_workspace", False, "but a request has prefill=True")
        if self.rows_view is View.COLUMNS:
            fail("ConvertSpec", "rows_view", self.rows_view.value, "must be plain or rows")


# --- drawing ---------------------------------------------------------------


def draw(d: Drawer, knobs: Knobs) -> ConvertSpec:
    """A convert call. What a kernel may compile per value (block size, BLOCK_N, K, the prefill
    flag, counting, the stride and compaction options, the views, the block table's width) comes
    from the run's deployment (``Deployment``: a pool per run seed, or the case's own draws)."""
    dep = Deployment(d, knobs, op="convert")
    prefill_workspace = dep.boolean("prefill_workspace")
    width = None
    if dep.pooled:  # the table's width first: it bounds the requests (max_table) and their lengths
        bs = dep.choice("block_size", knobs.block_sizes)
        width = table_width(dep, knobs, block_size=bs)
    hi_n = knobs.max_requests if width is None else max(1, min(knobs.max_requests, knobs.max_table // width))
    n = sized(d, knobs, 1, hi_n, tiles=knobs.row_tiles)
    if width is None:
        bs = dep.choice("block_size", knobs.block_sizes)  # draw_paging's own first draw, as before
    paging = draw_paging(d, knobs, block_size=bs)
    # The table holds n rows of ceil(seq_len / bs) + extra columns: at most max_table entries.
    if width is None:
        max_seq = max(0, min(knobs.max_seq_len, (knobs.max_table // n - paging.extra_table_cols) * bs))
    else:
        max_seq = min(knobs.max_seq_len, width * bs)
    rows_left = knobs.max_rows
    requests = []
    for i in range(n):
        prefill = prefill_workspace and d.boolean()
        hi = knobs.max_prefill_tokens if prefill else knobs.max_tokens_per_request
        tokens = sized(d, knobs, 1 if i == 0 else 0, max(1 if i == 0 else 0, min(hi, rows_left)))
        rows_left -= tokens
        requests.append(ConvertRequest(seq_len=sized(d, knobs, 0, max_seq), num_tokens=tokens, prefill=prefill))
    if width is not None:  # the deployment's width: the longest request's blocks plus unused columns
        need = max(-(-r.seq_len // bs) for r in requests)
        paging = dataclasses.replace(paging, extra_table_cols=width - need)
    rows = sum(r.num_tokens for r in requests)
    target = tile_total(d, knobs, rows, hi=knobs.max_rows)
    last = requests[-1]
    if target != rows and last.num_tokens + target - rows >= (1 if n == 1 else 0):
        requests[-1] = dataclasses.replace(last, num_tokens=last.num_tokens + target - rows)
    block_n = dep.choice("block_n", knobs.block_ns)
    return ConvertSpec(
        requests=tuple(requests),
        paging=paging,
        topk=block_n * dep.choice("topk_multiple", knobs.topk_multiples + knobs.odd_topk_multiples),
        block_n=block_n,
        topk_mode=d.choice(list(TopkMode)),
        prefill_workspace=prefill_workspace,
        return_valid_counts=not dep.boolean("return_valid_counts"),
        table_view=dep.view("table_view", knobs, (View.COLUMNS, View.ROWS)),
        rows_view=dep.view("rows_view", knobs, (View.ROWS,)),
        # A stride of block_size + extra: equal to it at times (the option passed with its
        # default's value), mostly larger, as padded layouts are.
        block_stride_rows=(bs + dep.integer("stride_extra", 0, bs + 7)) if dep.boolean("block_stride") else None,
        compact=dep.boolean("compact"),
        caller_out=draw_caller_out(d),
        # Last, so that every earlier draw of a seed is what it was before these arguments existed.
        idx_mapping=releases.draw_idx_mapping(d, dep),
        dcp=releases.draw_dcp(d, dep, prefill=any(r.prefill and r.num_tokens for r in requests)),
    )


def draw_caller_out(d: Drawer) -> CallerOut | None:
    """Caller-owned outputs in about a third of the cases (SPEC 9.2), mostly at the buffer's front."""
    if d.integer(0, 2):
        return None
    return CallerOut(
        rows_before=d.integer(1, 3) if d.integer(0, 3) == 0 else 0,
        rows_after=d.integer(0, 8),
        steps=d.integer(1, 2),
    )


# --- materializing -----------------------------------------------------------


def table_plan(spec: ConvertSpec) -> TablePlan:
    """The block table's host plan (its pool: every block id is below base_block + pool)."""
    seq = np.array([r.seq_len for r in spec.requests], dtype=np.int64)
    bs, paging = spec.paging.block_size, spec.paging
    return plan_table(
        need=(seq + bs - 1) // bs,
        layout=paging.layout,
        spare_blocks=paging.spare_blocks,
        extra_cols=paging.extra_table_cols,
        base_block=paging.base_block,
    )


def materialize(spec: ConvertSpec, *, seed: int, device: str) -> Case:
    """The call's tensors on ``device``, from the spec's numbers and the streams of ``seed``.

    With rows_view ROWS, req_id and token_indices are rows [a, a + N) of tensors of a + N + b rows
    (the whole step's req_id_per_token and top-k rows; the other rows belong to requests too)."""
    draws = Draws(seed, "convert")
    reqs, bs, k = spec.requests, spec.paging.block_size, spec.topk
    # The requests' numbers as columns (numpy: vector ops, not a Python loop per request).
    seq, tokens, prefill = np.array([(r.seq_len, r.num_tokens, r.prefill) for r in reqs], dtype=np.int64).T
    plan = table_plan(spec)
    before, after, _ = slack(spec.rows_view, draws=draws, width=k)  # the step's other rows around the batch's
    batch = convert_batch(
        draws,
        plan,
        seq=seq,
        tokens=tokens,
        prefill=prefill if spec.prefill_workspace else None,
        before=before,
        after=after,
        block_size=bs,
        topk=k,
        mode=spec.topk_mode,
        device=device,
    )
    table = table_view(
        batch.table, spec.table_view, draws=draws.child("table-view"), num_blocks=spec.paging.base_block + plan.pool
    )
    owners, indices, local_rows = batch.owners, batch.indices, batch.local_rows
    if before or after:  # the batch's rows of the step's
        mine = slice(before, before + int(tokens.sum()))
        owners, indices = owners[mine], indices[mine]
        local_rows = local_rows[mine].clone() if local_rows is not None else None  # not a step tensor: its own
    tensors: dict[str, torch.Tensor | None] = {
        "req_id": owners,
        "block_table": table,
        "token_indices": indices,
        "prefill_workspace_request_ids": local_rows,
        "prefill_workspace_starts": batch.workspace_starts if local_rows is not None else None,
    }
    params = {
        "BLOCK_SIZE": bs,
        "NUM_TOPK_TOKENS": k,
        "BLOCK_N": spec.block_n,
        "HAS_PREFILL_WORKSPACE": spec.prefill_workspace,
        "return_valid_counts": spec.return_valid_counts,
    }
    # The options only when drawn: an implementation without them is called exactly as before.
    if spec.block_stride_rows is not None:
        params["BLOCK_STRIDE_ROWS"] = spec.block_stride_rows
    if spec.compact:
        params["COMPACT_TO_FRONT"] = True
    params.update(caller_out_params(spec.caller_out))
    params.update(releases.release_params(spec.dcp))
    if spec.idx_mapping is not None:  # the same slots, each row's table row reached through the mapping
        tensors["idx_mapping"], tensors["req_id"] = releases.mapping_tensors(
            spec.idx_mapping, seed=seed, owners=owners, requests=len(reqs), device=device
        )
    if spec.caller_out is not None and spec.caller_out.steps == 2:
        tensors["prev_token_indices"] = step_before(indices, tokens=table.shape[1] * bs)
    return Case(
        op="convert", spec=spec, seed=int(seed), device=str(torch.device(device)), tensors=tensors, params=params
    )


def step_before(indices: torch.Tensor, *, tokens: int) -> torch.Tensor:
    """The top-k rows of the call before a two-step case's own (SPEC 9.2), a valid input too: the
    same rows with their columns reversed, so that the columns invalid now were mostly valid then
    (a stale slot left in them shows as a value, not as -1); and one valid column fewer (set to -1;
    a row without one: token 0 in its first column), so that no row's valid values are the same
    multiset in both steps and a compacted row left from the step before (any order of it is
    right) cannot pass. A token in [0, ``tokens``) (the table's width in tokens) is valid. No sync."""
    prev = indices.flip(1).contiguous()
    if not prev.numel() or tokens <= 0:
        return prev  # no column can be valid: both steps' rows are all -1
    valid = (prev >= 0) & (prev < tokens)
    # One max gives both: whether the row has a valid column (1 / 0) and the first one (a row
    # without: column 0, documented as the first maximal value's index); fewer device ops a case.
    some, column = valid.to(torch.int8).max(dim=1, keepdim=True)
    return prev.scatter_(1, column, some.to(prev.dtype).neg_())


def caller_out_params(c: CallerOut | None) -> dict[str, int]:
    """The case params that ask the harness for caller-owned outputs (harness/ops/convert.py)."""
    if c is None:
        return {}
    return {"out_rows_before": c.rows_before, "out_rows_after": c.rows_after, "out_steps": c.steps}


# --- features, size, shrinking -------------------------------------------------

_TOPK_FEATURES = {
    TopkMode.PADDED: {"idx:-1"},
    TopkMode.NEGATIVE: {"idx:-1", "idx:negative"},
    TopkMode.PAST_TABLE: {"idx:-1", "idx:past_table"},
    TopkMode.PAST_SEQ_LEN: {"idx:-1", "idx:past_seq_len"},
    TopkMode.MIXED: {"idx:-1", "idx:negative", "idx:past_table", "idx:past_seq_len"},
    TopkMode.VALID: set(),
}


def features(spec: ConvertSpec) -> set[str]:
    prefill = [r.prefill for r in spec.requests if r.num_tokens]
    out = {f"layout:{spec.paging.layout.value}", f"bs:{'1' if spec.paging.block_size == 1 else 'n'}"}
    out |= (
        {"batch:prefill-only"}
        if prefill and all(prefill)
        else {"batch:mixed"}
        if any(prefill)
        else {"batch:decode-only"}
    )
    out |= _TOPK_FEATURES[spec.topk_mode]
    if any(r.seq_len > spec.paging.block_size for r in spec.requests):
        out.add("block-boundary")
    if any(r.num_tokens == 0 for r in spec.requests):
        out.add("empty-request")
    if spec.block_stride_rows is not None:
        out.add("stride:padded" if spec.block_stride_rows > spec.paging.block_size else "stride:block_size")
    if spec.compact:
        out.add("compact")
    if spec.topk & (spec.topk - 1):  # vLLM 0.31.0: one padded tile when counted (GLM's 2176)
        out.add("topk:not-pow2")
    out |= caller_out_features(spec.caller_out) | releases.features(spec.idx_mapping, spec.dcp)
    return out | view_features(spec.paging, table=spec.table_view, rows=spec.rows_view)


def caller_out_features(c: CallerOut | None) -> set[str]:
    if c is None:
        return set()
    return (
        {"caller-out"}
        | ({"caller-out:2-steps"} if c.steps == 2 else set())
        | ({"caller-out:mid-buffer"} if c.rows_before else set())
    )


# --- optional capabilities (SPEC section 7) ------------------------------------

STRIDE, COMPACT = "block_stride_rows", "compact_to_front"  # capability names (kernels/external.py)
CALLER_OUT = "caller_out"  # SPEC 9.2: the signature takes out= and valid_counts_out=


def needs(case: Case) -> frozenset[str]:
    """The optional capabilities this case calls for."""
    p = case.params
    return (
        frozenset({STRIDE} if "BLOCK_STRIDE_ROWS" in p else ())
        | frozenset({COMPACT} if p.get("COMPACT_TO_FRONT") else ())
        | frozenset({CALLER_OUT} if "out_steps" in p else ())
        | releases.needs(case)
    )


def fit(spec: ConvertSpec, capabilities: frozenset[str]) -> ConvertSpec:
    """``spec`` without the options an implementation with ``capabilities`` lacks."""
    changes: dict = {}
    if spec.block_stride_rows is not None and STRIDE not in capabilities:
        changes["block_stride_rows"] = None
    if spec.compact and COMPACT not in capabilities:
        changes["compact"] = False
    if spec.caller_out is not None and CALLER_OUT not in capabilities:
        changes["caller_out"] = None
    changes.update(releases.fit(spec, capabilities))
    return dataclasses.replace(spec, **changes) if changes else spec


def size(spec: ConvertSpec) -> dict[str, int]:
    return {"requests": len(spec.requests), "rows": sum(r.num_tokens for r in spec.requests), "topk": spec.topk}


def reduce(s: ConvertSpec) -> Iterator[ConvertSpec]:
    for reqs in drop_each(s.requests):
        if any(r.num_tokens for r in reqs):
            yield from attempt(lambda: dataclasses.replace(s, requests=reqs))
    for j, r in enumerate(s.requests):
        for v in halvings(r.num_tokens):
            yield from attempt(lambda: with_request(s, j, num_tokens=v))
        for v in halvings(r.seq_len):
            yield from attempt(lambda: with_request(s, j, seq_len=v))
        if r.prefill:
            yield from attempt(lambda: with_request(s, j, prefill=False))
    if s.prefill_workspace and not any(r.prefill for r in s.requests):
        yield dataclasses.replace(s, prefill_workspace=False)
    if s.topk > s.block_n:
        yield from attempt(lambda: dataclasses.replace(s, topk=s.block_n))
    for p in paging_steps(s.paging):
        yield dataclasses.replace(s, paging=p)
    yield from view_steps(s, "table_view", "rows_view")
    yield from to_defaults(s, "topk_mode")  # toward its simplest value only: never back and forth
    if s.compact:
        yield dataclasses.replace(s, compact=False)
    yield from caller_out_steps(s)
    yield from releases.reduce(s)
    if s.block_stride_rows is not None:
        yield dataclasses.replace(s, block_stride_rows=None)
        if s.block_stride_rows != s.paging.block_size:
            yield dataclasses.replace(s, block_stride_rows=s.paging.block_size)


def caller_out_steps(s):
    """Simpler caller-owned outputs: none, one step, no rows around the slice."""
    c = s.caller_out
    if c is None:
        return
    yield dataclasses.replace(s, caller_out=None)
    for smaller in (
        dataclasses.replace(c, steps=1),
        dataclasses.replace(c, rows_before=0),
        dataclasses.replace(c, rows_after=0),
    ):
        if smaller != c:
            yield dataclasses.replace(s, caller_out=smaller)


# --- error inputs (SPEC section 3: "must reject with a clear exception before launching") ---


def _length_mismatch(case: Case) -> Case | None:
    # The PR #48642 bug: the full req_id (T rows) passed with the decode-only indices.
    req = case.tensors["req_id"]
    extra = req[:1].repeat(3) if req.numel() else torch.zeros(3, dtype=req.dtype, device=req.device)
    return with_(case, tensors={"req_id": torch.cat([req, extra])})


def _convert_wrong_dtype(case: Case) -> Case | None:
    return with_(case, tensors={"req_id": case.tensors["req_id"].to(torch.int64)})


def _k_mismatch(case: Case) -> Case | None:
    k, bn = case.params["NUM_TOPK_TOKENS"], case.params["BLOCK_N"]
    return with_(case, params={"NUM_TOPK_TOKENS": k - bn}) if k > bn else None


def _k_not_multiple(case: Case) -> Case | None:
    k = case.params["NUM_TOPK_TOKENS"]
    return with_(case, params={"BLOCK_N": 2 * k})


def _bad_block_size(case: Case) -> Case | None:
    return with_(case, params={"BLOCK_SIZE": 0})


def _bad_block_stride(case: Case) -> Case | None:
    # Only where the case passes a stride: an implementation without the option never gets one.
    return with_(case, params={"BLOCK_STRIDE_ROWS": 0}) if "BLOCK_STRIDE_ROWS" in case.params else None


def _req_out_of_range(case: Case) -> Case | None:
    req = case.tensors["req_id"].clone()
    if not req.numel():
        return None
    req[0] = case.tensors["block_table"].shape[0]
    return with_(case, tensors={"req_id": req})


INVALID: tuple[InvalidClass, ...] = (
    InvalidClass(
        name="length_mismatch",
        memory_safe=False,
        make=_length_mismatch,
        description="req_id has more rows than token_indices (full req_id with decode-only indices)",
    ),
    InvalidClass(name="wrong_dtype", memory_safe=True, make=_convert_wrong_dtype, description="req_id is int64"),
    InvalidClass(
        name="k_mismatch", memory_safe=True, make=_k_mismatch, description="NUM_TOPK_TOKENS != token_indices.shape[1]"
    ),
    InvalidClass(
        name="k_not_multiple_of_block_n",
        memory_safe=False,
        make=_k_not_multiple,
        description="NUM_TOPK_TOKENS is not a multiple of BLOCK_N",
    ),
    # Not memory-safe: a kernel without the check divides by zero, and a GPU's integer division by
    # zero is no trap but an arbitrary quotient, so the block index read is anyone's (vLLM 0.30.0's
    # convert took an illegal address on it, on an H100; the other releases happened to survive).
    InvalidClass(name="bad_block_size", memory_safe=False, make=_bad_block_size, description="BLOCK_SIZE == 0"),
    InvalidClass(
        name="bad_block_stride",
        memory_safe=True,
        make=_bad_block_stride,
        description="BLOCK_STRIDE_ROWS == 0 (an optional capability, where the case passes one)",
    ),
    InvalidClass(
        name="req_out_of_range",
        memory_safe=False,
        make=_req_out_of_range,
        description="a req_id >= the block table's rows (not checked by vLLM)",
    ),
)


GENERATOR = Generator(
    spec_type=ConvertSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=size,
    reduce=reduce,
    invalid=INVALID,
)
