"""The ``step`` op: a whole scheduler step (SPEC.md sections 1 and 5).

A ``StepSpec`` lists the step's requests in the scheduler's order (decode ->
extend -> prefill, SPEC section 1) plus everything the step's metadata depends
on: paging, K and BLOCK_N, the split's threshold and uniformity rule, and the
workspace size that bounds the chunked context. This module holds the spec,
its drawer, materializer, features and shrink steps.

Readings chosen where SPEC is silent (the oracle and the pipeline share them):

- Token count. ``num_tokens`` (vLLM's num_actual_tokens) is ``R * q0`` when
  the batch is a uniform decode batch padded for CUDA graphs (every
  query_len equals q0 = query_len[0] or is 0, and q0 <= threshold), else
  ``query_start_loc[-1]``. That is exactly what SPEC 5.1's "T must equal R *
  query_len[0]" asks of a padded batch.
- Padding tokens (the tokens past ``query_start_loc[-1]``) belong to the
  zero-length requests, q0 each, in request order: ``req_id_per_token`` lays
  them out as if every request had q0 tokens. Zero-length requests form the
  tail of the batch.
- ``topk_indices`` rows are request-local positions ``< seq_len`` of the
  token's request (``-1`` padded when ``topk_padded``); a request with
  seq_len 0 gets an all ``-1`` row. Positions may repeat within a row
  (generators/rng/topk.py ``topk_indices``).
- DCP (``dcp_world_size`` D > 1, interleave I; SPEC 9.1, used by the packing
  planner's revisions only), simulated on one device: context position p of a
  request lives on rank ``(p // I) % D`` at local position ``(p // (D*I)) * I
  + p % I``. ``dcp_kv_cache`` holds every rank's blocks in one pool and
  ``dcp_block_table`` [D * R, M] rank k's table in rows [k*R, (k+1)*R): request
  r owns ``ceil(padded / bs)`` contiguous blocks on each rank, ``padded =
  ceil(ctx / (D*I)) * I`` (the rank-local rows a gather may be asked for);
  local positions a rank does not hold are zero records.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import ClassVar, Iterator

import numpy as np
import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import SMALL, Drawer, Knobs, draw_paging
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.reduce import attempt, drop_each, halvings, paging_steps, with_request
from mlafuzz.generators.rng.fill import block_table, plan_table, upload
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.rng.records import paged_cache
from mlafuzz.generators.rng.topk import topk_indices, topk_rows
from mlafuzz.generators.spec import (
    Layout,
    Paging,
    SpecError,
    TopkMode,
    ValueMode,
    check_int,
    check_topk_tiling,
    coerce_enum,
    coerce_tuple,
    fail,
)
from mlafuzz.oracles.metadata import split_decodes_and_prefills_loop

__all__ = ["RequestKind", "StepRequest", "StepSpec", "draw", "materialize", "features", "reduce", "size"]


class RequestKind(int, enum.Enum):
    """SPEC section 1's classes, valued by their rank in the scheduler's order."""

    DECODE = 0
    EXTEND = 1
    PREFILL = 2


@dataclass(frozen=True, kw_only=True)
class StepRequest:
    context_len: int  # tokens already in the cache (num_computed_tokens)
    query_len: int  # tokens scheduled this step; 0 for a CUDA-graph padding request

    def __post_init__(self) -> None:
        check_int("StepRequest", "context_len", self.context_len, lo=0, hi=1 << 24)
        check_int("StepRequest", "query_len", self.query_len, lo=0, hi=1 << 20)

    @property
    def seq_len(self) -> int:
        return self.context_len + self.query_len

    def kind(self, threshold: int) -> RequestKind:
        if self.context_len == 0:
            return RequestKind.PREFILL
        return RequestKind.DECODE if self.query_len <= threshold else RequestKind.EXTEND


@dataclass(frozen=True, kw_only=True)
class StepSpec:
    """One scheduler step (SPEC sections 1 and 5)."""

    op: ClassVar[str] = "step"
    requests: tuple[StepRequest, ...]
    paging: Paging = Paging()
    topk: int = 64  # K (NUM_TOPK_TOKENS)
    block_n: int = 16  # BLOCK_N of the convert launch; K must be a multiple of it
    threshold: int = 1  # decode threshold of the split (5.1)
    require_uniform: bool = True  # the FlashMLA sparse builder's rule
    workspace_rows: int = 256  # W: bounds the chunked context (5.2) and the prefill chunks (5.3)
    values: ValueMode = ValueMode.ACTIVATIONS
    topk_padded: bool = True  # top-k rows: distinct positions then -1 (else K positions, repeats allowed)
    dcp_world_size: int = 1  # D: decode-context parallelism of the context gather (SPEC 9.1)
    dcp_interleave: int = 1  # I: tokens per rank in turn (1 without DCP)

    def __post_init__(self) -> None:
        coerce_tuple(self, "requests", StepRequest)
        coerce_enum(self, "values", ValueMode)
        if not self.requests:
            fail("StepSpec", "requests", self.requests, "must hold at least one request")
        if self.requests[0].query_len == 0:
            fail("StepSpec", "requests[0].query_len", 0, "must be >= 1 (decode_query_len is read off it)")
        check_topk_tiling("StepSpec", topk=self.topk, block_n=self.block_n)
        check_int("StepSpec", "threshold", self.threshold, lo=0, hi=1 << 20)
        check_int("StepSpec", "workspace_rows", self.workspace_rows, lo=1, hi=1 << 24)
        check_int("StepSpec", "dcp_world_size", self.dcp_world_size, lo=1, hi=8)
        check_int("StepSpec", "dcp_interleave", self.dcp_interleave, lo=1, hi=64)
        if self.dcp_world_size == 1 and self.dcp_interleave != 1:
            fail("StepSpec", "dcp_interleave", self.dcp_interleave, "must be 1 without DCP (dcp_world_size=1)")
        align = math.lcm(self.paging.block_size, self.dcp_world_size * self.dcp_interleave)
        if self.dcp_world_size > 1 and self.workspace_rows < align:
            fail(
                "StepSpec",
                "workspace_rows",
                self.workspace_rows,
                f"is below the DCP chunk alignment lcm(block_size, D*I)={align} (docs/contract.md, step)",
            )
        self._check_order()
        self._check_metadata()

    # -- validation ---------------------------------------------------------

    def _check_order(self) -> None:
        kinds = [r.kind(self.threshold) for r in self.requests]
        for i in range(1, len(kinds)):
            if kinds[i] < kinds[i - 1]:
                fail(
                    "StepSpec",
                    f"requests[{i}]",
                    self.requests[i],
                    f"is a {kinds[i].name.lower()} after a {kinds[i - 1].name.lower()} (threshold="
                    f"{self.threshold}): the scheduler orders decode -> extend -> prefill",
                )
        first_pad = next((i for i, r in enumerate(self.requests) if r.query_len == 0), len(self.requests))
        if any(r.query_len for r in self.requests[first_pad:]):
            fail(
                "StepSpec",
                f"requests[{first_pad}].query_len",
                0,
                "but a later request has tokens: zero-length (padding) requests form the tail",
            )

    def _check_metadata(self) -> None:
        nd, _np, ndt, _npt = self.split()
        if nd:
            dql = self.requests[0].query_len
            if ndt % dql:
                fail(
                    "StepSpec",
                    "require_uniform",
                    self.require_uniform,
                    f"gives decodes of unequal query_len: num_decode_tokens={ndt} is not a multiple of "
                    f"decode_query_len={dql} (docs/contract.md, step)",
                )
        with_ctx = sum(1 for r in self.requests[nd:] if r.context_len > 0)
        if with_ctx and (self.workspace_rows // with_ctx) // self.paging.block_size == 0:
            fail(
                "StepSpec",
                "workspace_rows",
                self.workspace_rows,
                f"is too small: {with_ctx} prefill requests with context need >= "
                f"{with_ctx * self.paging.block_size} rows (one block each; docs/contract.md, step)",
            )

    # -- derived quantities (pure functions of the spec) --------------------

    @property
    def query_start_loc(self) -> tuple[int, ...]:
        out = [0]
        for r in self.requests:
            out.append(out[-1] + r.query_len)
        return tuple(out)

    @property
    def num_tokens(self) -> int:
        """T (module docstring): R * q0 for a padded uniform decode batch, else query_start_loc[-1]."""
        q0 = self.requests[0].query_len
        if q0 <= self.threshold and all(r.query_len in (0, q0) for r in self.requests):
            return len(self.requests) * q0
        return self.query_start_loc[-1]

    def split(self) -> tuple[int, int, int, int]:
        """SPEC 5.1 on this batch (the oracle's reading): (decodes, prefills, decode tokens, prefill tokens).
        The oracle's rule-by-rule form: on a spec's few requests plain Python beats a dozen torch
        ops, and a case asks for the split several times (validation, drawing, features)."""
        try:
            return split_decodes_and_prefills_loop(
                query_start_loc=list(self.query_start_loc),
                threshold=self.threshold,
                require_uniform=self.require_uniform,
                num_tokens=self.num_tokens,
            )
        except ValueError as exc:  # cannot happen given num_tokens; keep the one-line contract anyway
            raise SpecError(f"StepSpec: requests={self.requests!r} cannot be split: {exc}") from None

    def dense_route(self) -> bool:
        """SPEC 5.4: every prefill (after the split) has seq_len <= K."""
        nd = self.split()[0]
        return all(r.seq_len <= self.topk for r in self.requests[nd:])


# --- drawing ---------------------------------------------------------------


def draw(d: Drawer, knobs: Knobs = SMALL) -> StepSpec:
    """A valid step: options are ordered so Hypothesis shrinks towards a small plain batch."""
    # A step's whole cache is generated (the pipeline gathers every context): it stays at the bottom
    # of its cache (no base_block), and its contexts are held to max_records records below.
    paging = draw_paging(d, knobs, high=False)
    bs = paging.block_size
    block_n = d.choice(knobs.block_ns)
    k = block_n * d.choice(knobs.topk_multiples)
    threshold = d.choice((1, 2, 4))
    require_uniform = not d.boolean()
    dense = not d.boolean()
    max_q = max(1, knobs.max_tokens_per_request)
    n_req = max(1, knobs.max_requests)
    max_ctx = max(1, min(knobs.max_seq_len, knobs.max_records // (n_req + 2)))  # every request's cache is made

    n_dec = d.integer(0, n_req)
    n_ext = d.integer(0, max(0, min(2, n_req - n_dec)))
    n_pre = d.integer(0 if n_dec + n_ext else 1, max(0 if n_dec + n_ext else 1, min(2, n_req - n_dec - n_ext)))
    n_pad = d.integer(0, 2) if d.boolean() else 0

    def upto(lo: int, hi: int) -> int:  # anywhere in [lo, hi], or near hi (long contexts make several chunks)
        hi = max(lo, hi)
        return d.integer(lo, hi) if not d.boolean() else hi - d.integer(0, (hi - lo) // 4)

    q_dec = d.integer(1, threshold)  # > 1 is speculative decoding
    reqs = [StepRequest(context_len=d.integer(1, max_ctx), query_len=q_dec) for _ in range(n_dec)]
    for _ in range(n_ext):
        q = d.integer(threshold + 1, threshold + max_q)
        # Sparse route: the sequence is longer than K through its context (cheap: no extra tokens).
        ctx = upto(1, k - q) if dense else upto(max(1, k + 1 - q), max_ctx)
        reqs.append(StepRequest(context_len=ctx, query_len=q))
    lo = 1 if require_uniform else threshold + 1  # else a short prefill joins the decodes with another length
    for i in range(n_pre):
        long = not dense and ((n_ext == 0 and i == 0) or d.integer(0, 3) == 0)
        q_lo = max(lo, k + 1) if long else lo
        q = d.integer(q_lo, q_lo + max_q) if long else d.integer(lo, max(lo, min(k, lo + 4 * max_q)))
        reqs.append(StepRequest(context_len=0, query_len=q))
    reqs += [StepRequest(context_len=0, query_len=0) for _ in range(n_pad)]

    with_ctx = max(1, n_ext + (n_dec if n_ext + n_pre == 0 else 0))
    workspace_rows = with_ctx * bs * d.choice((1, 2, 3, 8))
    world = d.choice((1, 1, 1, 1, 2, 3, 4, 8))
    inter = d.choice((1, 2, 4, 8, 16, 32, 64)) if world > 1 else 1
    if world > 1:  # the workspace holds at least one aligned piece (vLLM rounds it up to one)
        align = math.lcm(bs, world * inter)
        workspace_rows = max(workspace_rows, align * d.choice((1, 2)))
    spec_kw = dict(
        dcp_world_size=world,
        dcp_interleave=inter,
        requests=tuple(reqs),
        paging=paging,
        topk=k,
        block_n=block_n,
        threshold=threshold,
        require_uniform=require_uniform,
        values=d.choice(list(ValueMode)),
        topk_padded=not d.boolean(),
    )
    try:
        return StepSpec(workspace_rows=workspace_rows, **spec_kw)
    except SpecError:
        # The split put more requests with context on the prefill side than drawn for (a decode batch
        # without the uniform rule): a workspace large enough for every request is always valid.
        return StepSpec(workspace_rows=max(workspace_rows, len(reqs) * bs * 8), **spec_kw)


# --- materializing ---------------------------------------------------------


def materialize(spec: StepSpec, *, seed: int, device: str) -> Case:
    """The step's tensors on ``device``; req_id_per_token per the module docstring (padding tokens go
    to the zero-length requests, q0 each, in request order)."""
    draws = Draws(seed, "step")
    reqs, bs = spec.requests, spec.paging.block_size
    seq_lens = [r.seq_len for r in reqs]
    plan = plan_table(
        need=[-(-n // bs) for n in seq_lens],
        layout=spec.paging.layout,
        spare_blocks=spec.paging.spare_blocks,
        extra_cols=spec.paging.extra_table_cols,
        base_block=spec.paging.base_block,
    )
    qsl = spec.query_start_loc
    pads = [r for r, req in enumerate(reqs) if req.query_len == 0]
    q0, extra = reqs[0].query_len, spec.num_tokens - qsl[-1]
    table_rows, topk_host, query_lens, seq_dev, qsl_dev, pad_dev = upload(
        plan.rows,
        topk_rows(seq_lens=seq_lens, width=plan.width, block_size=bs, topk=spec.topk),
        [r.query_len for r in reqs],
        seq_lens,
        qsl,
        pads,
        device=device,
    )
    table = block_table(draws.child("table"), plan, rows=table_rows, device=device)
    cache = paged_cache(
        draws.child("cache"),
        spec.values,
        pool_blocks=plan.pool,
        block_size=bs,
        base_block=spec.paging.base_block,
        device=device,
    )
    owners = torch.repeat_interleave(
        torch.arange(len(reqs), dtype=torch.int32, device=device), query_lens, output_size=qsl[-1]
    )
    if extra:
        owners = torch.cat([owners, torch.repeat_interleave(pad_dev, q0, output_size=len(pads) * q0)[:extra]])
    indices = topk_indices(
        draws.child("topk"),
        per_row=torch.index_select(topk_host, 0, owners),
        width=plan.width,
        block_size=bs,
        topk=spec.topk,
        mode=TopkMode.PADDED if spec.topk_padded else TopkMode.VALID,
        device=device,
    )
    tensors = {
        "kv_cache": cache,
        "block_table": table,
        "query_start_loc": qsl_dev,
        "seq_lens": seq_dev,
        "req_id_per_token": owners,
        "topk_indices": indices,
    }
    if spec.dcp_world_size > 1:
        tensors.update(_dcp_caches(spec, cache, table))
    params = {
        "dcp_world_size": spec.dcp_world_size,
        "dcp_interleave": spec.dcp_interleave,
        "num_tokens": spec.num_tokens,
        "threshold": spec.threshold,
        "require_uniform": spec.require_uniform,
        "workspace_rows": spec.workspace_rows,
        "topk": spec.topk,
        "block_n": spec.block_n,
        "block_size": bs,
    }
    return Case(
        op="step",
        spec=spec,
        seed=int(seed),
        device=str(torch.device(device)),
        tensors=tensors,
        params=params,
        zero_blocks={"kv_cache": spec.paging.base_block} if spec.paging.base_block else {},
    )


def _dcp_caches(spec: StepSpec, cache: torch.Tensor, table: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every rank's cache and block table (module docstring), made from the step's own records.

    Where each local slot's record comes from is a function of the spec alone, worked out on the
    host in a few numpy ops and sent in one copy; only the step's block table (on the device) turns
    (request, block) into a slot there: no host sync, no per-rank loop (issue 29).
    tests/generators/test_step_spec.py holds it to the per-rank loop it replaced."""
    world, inter, bs = spec.dcp_world_size, spec.dcp_interleave, spec.paging.block_size
    virtual = world * inter
    ctx = np.array([r.context_len for r in spec.requests], dtype=np.int64)
    n_req = len(ctx)
    blocks = np.maximum(1, -(-(-(-ctx // virtual) * inter) // bs))  # ceil(padded / bs), at least one
    per_rank = int(blocks.sum())
    first = np.cumsum(blocks) - blocks
    col = np.arange(int(blocks.max()))
    rank = np.arange(world)[:, None, None]
    # Rank k's row of request r: its blocks[r] contiguous local blocks, then zeros.
    local_table = np.where(col < blocks[:, None], rank * per_rank + first[:, None] + col, 0).reshape(world * n_req, -1)
    # Local slot (k, r, j), rank after rank, request after request: position p of request r, or none.
    owner = np.repeat(np.arange(n_req), blocks * bs)
    j = np.arange(per_rank * bs) - np.repeat(first * bs, blocks * bs)
    p = (j // inter) * virtual + np.arange(world)[:, None] * inter + j % inter  # [world, per_rank * bs]
    held = p < ctx[owner]
    req, blk, off, keep, local_table_dev = upload(
        np.broadcast_to(owner, p.shape).reshape(-1),
        np.where(held, p // bs, 0).reshape(-1),  # block 0 where the rank holds none: masked below
        (p % bs).reshape(-1),
        held.reshape(-1),
        local_table,
        device=cache.device,
    )
    slots = table[req.long(), blk.long()].long() * bs + off
    flat = cache.view(torch.uint8).reshape(-1, cache.shape[-1])
    local = torch.where(keep.bool()[:, None], flat[slots], torch.zeros((), dtype=torch.uint8, device=cache.device))
    return {
        "dcp_kv_cache": local.reshape(world * per_rank, bs, cache.shape[-1]),
        "dcp_block_table": local_table_dev,
    }


# --- features --------------------------------------------------------------


def features(spec: StepSpec) -> set[str]:
    nd, n_pre, ndt, npt = spec.split()
    out = {
        f"layout:{spec.paging.layout.value}",
        f"bs:{'1' if spec.paging.block_size == 1 else 'n'}",
        f"values:{spec.values.value}",
    }
    out.add("batch:decode-only" if n_pre == 0 else "batch:prefill-only" if nd == 0 else "batch:mixed")
    if nd and spec.requests[0].query_len > 1:
        out.add("spec-decode")
    if any(r.query_len == 0 for r in spec.requests):
        out.add("padded-requests")
    prefills = spec.requests[nd:]
    if prefills:
        out.add("dense-prefill" if spec.dense_route() else "sparse-prefill")
    ctx = [r.context_len for r in prefills]
    with_ctx = sum(1 for c in ctx if c > 0)
    if with_ctx:
        chunk = (spec.workspace_rows // with_ctx) // spec.paging.block_size * spec.paging.block_size
        if max(ctx) > chunk:
            out.add("multi-chunk")
    running, groups = 0, 0
    for r in prefills:  # SPEC 5.3's greedy grouping, for the "several prefill chunks" corner
        if groups == 0 or running + r.seq_len > spec.workspace_rows:
            groups, running = groups + 1, 0
        running += r.seq_len
    if groups > 1:
        out.add("prefill-chunks>1")
    if spec.dcp_world_size > 1:
        out.add("dcp")
    return out


def size(spec: StepSpec) -> dict[str, int]:
    return {"requests": len(spec.requests), "tokens": spec.num_tokens}


def reduce(s: StepSpec) -> Iterator[StepSpec]:
    for reqs in drop_each(s.requests):
        yield from attempt(lambda: dataclasses.replace(s, requests=reqs))
    for j, r in enumerate(s.requests):
        for v in halvings(r.context_len):
            yield from attempt(lambda: with_request(s, j, context_len=v))
        for v in halvings(r.query_len):
            yield from attempt(lambda: with_request(s, j, query_len=v))
    if s.topk > s.block_n:
        yield from attempt(lambda: dataclasses.replace(s, topk=s.block_n))
    for p in paging_steps(s.paging):
        yield from attempt(lambda: dataclasses.replace(s, paging=p))
    if s.paging.block_size != 1 and s.paging.layout is Layout.CONTIGUOUS:
        yield from attempt(lambda: dataclasses.replace(s, paging=dataclasses.replace(s.paging, block_size=1)))
    if s.values is not ValueMode.ACTIVATIONS:
        yield dataclasses.replace(s, values=ValueMode.ACTIVATIONS)
    if not s.topk_padded:
        yield dataclasses.replace(s, topk_padded=True)
    if s.dcp_world_size > 1:
        yield from attempt(lambda: dataclasses.replace(s, dcp_world_size=1, dcp_interleave=1))


GENERATOR = Generator(
    spec_type=StepSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=size,
    reduce=reduce,
    invalid=(),
)
