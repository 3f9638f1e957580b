"""Oracle for a whole step (SPEC.md sections 1 and 5): what the pipeline must build and produce.

Given one step's tensors (query_start_loc, seq_lens, req_id_per_token,
topk_indices, block_table, kv_cache) and its parameters (num_tokens,
threshold, require_uniform, workspace_rows, K), returns the same named
outputs as an implementation of the pipeline:

- the split counts (5.1), computed once, and the FP8 separate metadata
  (5.3) from those very counts: decode_query_len, num_active_decodes,
  prefill_request_ids [T], prefill_chunks [n, 2], workspace_starts [P],
  prefill_chunk_seq_tot [n];
- the chunked-context plan over the prefill side's contexts, by the
  revision's ``context_chunks`` rule: ``equal_width`` (5.2) or
  ``packing_planner`` (9.1, as vLLM's call site asks it without DCP: B = W,
  max_context_chunk = round_down(W, bs), split_alignment = bs): context_chunk
  (the width, or max_context_chunk), context_requests [n_chunks, 2] (each
  chunk's prefill-local request range; all prefills for an equal-width
  chunk), context_starts / context_lens [n_chunks, P] (0 outside the
  chunk's range), context_cu_seq_lens [n_chunks, P+1] (a chunk's own [n+1]
  is its slice [request_start : request_end + 1]), context_seq_tot
  [n_chunks]; under DCP (world D > 1, interleave I; the planner's rule only)
  the planner gets B = W // D, alignment lcm(bs, D*I), padded rows
  ceil(r / (D*I)) * I, and the plan stays in global token starts and lengths;
- dense_route (5.4): 1 when every prefill has seq_len <= K;
- decode_slots [num_decode_tokens, K]: section 3 on the decode subset only;
- prefill_slots: on the sparse route, the prefill rows converted to
  workspace offsets (HAS_PREFILL_WORKSPACE with the 5.3 ids and starts);
  [0, K] on the dense route;
- context_rows (dense route): every context token of every prefill-side
  request, dequantized, request after request, each exactly once and in
  position order -- the 5.2 invariant, stated directly, never through the
  chunk plan; prefill_seq_rows (sparse route): every token of every prefill
  sequence, in prefill order. Each is [0, 576] on the other route.

All int outputs are int32 (0-d for scalars), rows are bf16; everything is on
the CPU. ``step_oracle(loop=True)`` uses the loop version of every building
block (obviously correct, for minimized cases); ``loop=False`` the
vectorized ones. The two are held equal by tests/test_step_oracle.py.

Readings chosen where SPEC is silent: those of `oracles.metadata` and
`oracles.fp8_separate` (an oversized prefill gets a 5.3 chunk of its own);
a request's context is ``seq_len - query_len``; the route is decided over the
requests the split put on the prefill side (none: dense).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from mlafuzz.oracles._seq import host_copies
from mlafuzz.oracles.codec import ROW_DIM, as_record_bytes, dequant_records, dequant_records_loop
from mlafuzz.oracles.convert import convert, convert_loop
from mlafuzz.oracles.metadata import (
    chunked_context,
    chunked_context_loop,
    fp8_separate_metadata,
    fp8_separate_metadata_loop,
    split_decodes_and_prefills,
    split_decodes_and_prefills_loop,
)
from mlafuzz.oracles.plan import padded_rows_of, plan_loop

__all__ = ["StepMetadata", "step_metadata", "step_oracle", "sequence_rows", "sequence_rows_loop"]


def _i32(values: object, shape: tuple[int, ...] | None = None) -> Tensor:
    t = torch.tensor(values, dtype=torch.int32)
    return t.reshape(shape) if shape is not None else t


def sequence_rows_loop(*, kv_cache: Tensor, block_table: Tensor, requests: list[int], lengths: list[int]) -> Tensor:
    """Positions 0..lengths[i]-1 of request requests[i], dequantized one record at a time, in order."""
    cache = as_record_bytes(kv_cache).cpu()
    bs = cache.shape[1]
    table = block_table.tolist()
    rows = [
        dequant_records_loop(cache[table[r][p // bs], p % bs].unsqueeze(0))[0]
        for r, n in zip(requests, lengths)
        for p in range(n)
    ]
    return torch.stack(rows) if rows else torch.empty((0, ROW_DIM), dtype=torch.bfloat16)


def sequence_rows(*, kv_cache: Tensor, block_table: Tensor, requests: list[int], lengths: list[int]) -> Tensor:
    """Vectorized `sequence_rows_loop`: one index of (request, position) pairs into the cache."""
    cache = as_record_bytes(kv_cache).cpu()
    bs = cache.shape[1]
    if sum(lengths) == 0:
        return torch.empty((0, ROW_DIM), dtype=torch.bfloat16)
    req = torch.repeat_interleave(torch.tensor(requests, dtype=torch.int64), torch.tensor(lengths))
    starts = torch.cumsum(torch.tensor([0] + lengths[:-1]), 0)
    pos = torch.arange(req.numel()) - torch.repeat_interleave(starts, torch.tensor(lengths))
    blocks = block_table.cpu().to(torch.int64)[req, pos // bs]
    return dequant_records(cache[blocks, pos % bs])


@dataclass(frozen=True)
class _Planned:
    """The packing planner's chunks in the dense [n_chunks, P] form of the 5.2 plan."""

    chunk: int
    starts: list[list[int]]
    lens: list[list[int]]
    cu_seq_lens: list[list[int]]
    seq_tot: list[int]
    requests: list[tuple[int, int]]

    @property
    def n_chunks(self) -> int:
        return len(self.seq_tot)


def _planned(ctx: list[int], workspace_rows: int, bs: int, world: int, interleave: int) -> _Planned:
    """The planner called as vLLM's call site calls it (DCP: B = W // D, alignment lcm(bs, D*I))."""
    align = bs if world == 1 else math.lcm(bs, world * interleave)
    cap = workspace_rows // align * align
    chunks = plan_loop(
        context_lens=ctx,
        row_budget=workspace_rows // world,
        max_context_chunk=cap,
        split_alignment=align,
        padded_rows=padded_rows_of(dcp_world_size=world, interleave=interleave),
    )
    starts = [[0] * len(ctx) for _ in chunks]
    lens = [[0] * len(ctx) for _ in chunks]
    for i, c in enumerate(chunks):
        starts[i][c.request_start : c.request_end] = c.starts
        lens[i][c.request_start : c.request_end] = c.seq_lens
    cu = [[sum(row[:j]) for j in range(len(row) + 1)] for row in lens]
    return _Planned(
        cap, starts, lens, cu, [sum(row) for row in lens], [(c.request_start, c.request_end) for c in chunks]
    )


@dataclass(frozen=True)
class StepMetadata:
    """What a step's metadata says, from its host ints alone: ``outputs``, the pipeline's metadata
    outputs (host int32, as ``step_oracle`` returns them), and what the data outputs are made of."""

    outputs: dict[str, Tensor]
    num_decodes: int
    num_decode_tokens: int
    dense: bool
    prefills: list[int]  # the prefill side's requests
    context_lens: list[int]  # of each prefill-side request
    seq_lens: list[int]  # of each request
    prefill_request_ids: list[int]
    workspace_starts: list[int]


def step_metadata(
    *,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_size: int,
    num_tokens: int,
    threshold: int,
    require_uniform: bool,
    workspace_rows: int,
    topk: int,
    context_chunks: str = "equal_width",
    dcp_world_size: int = 1,
    dcp_interleave: int = 1,
    loop: bool = False,
) -> StepMetadata:
    """The metadata half of ``step_oracle``, from host lists (no tensor is read)."""
    split_fn: Callable = split_decodes_and_prefills_loop if loop else split_decodes_and_prefills
    sep_fn: Callable = fp8_separate_metadata_loop if loop else fp8_separate_metadata
    ctx_fn: Callable = chunked_context_loop if loop else chunked_context
    qsl, sl, bs = query_start_loc, seq_lens, block_size
    nd, n_pre, ndt, npt = split_fn(
        query_start_loc=qsl, threshold=threshold, require_uniform=require_uniform, num_tokens=num_tokens
    )
    sep = sep_fn(
        query_start_loc=qsl,
        seq_lens=sl,
        num_decodes=nd,
        num_decode_tokens=ndt,
        workspace_rows=workspace_rows,
        num_tokens=num_tokens,
    )
    prefills = list(range(nd, len(sl)))
    ctx = [sl[r] - (qsl[r + 1] - qsl[r]) for r in prefills]
    if context_chunks == "packing_planner":
        plan = _planned(ctx, workspace_rows, bs, dcp_world_size, dcp_interleave)
    elif context_chunks == "equal_width":
        plan = ctx_fn(context_lens=ctx, workspace_rows=workspace_rows, block_size=bs)
    else:
        raise ValueError(f"context_chunks={context_chunks!r}: expected equal_width or packing_planner")
    requests = getattr(plan, "requests", [(0, len(ctx))] * plan.n_chunks)
    dense = all(sl[r] <= topk for r in prefills)
    n_ctx = plan.n_chunks
    outputs = {
        "num_decodes": _i32(nd),
        "num_prefills": _i32(n_pre),
        "num_decode_tokens": _i32(ndt),
        "num_prefill_tokens": _i32(npt),
        "decode_query_len": _i32(sep.decode_query_len),
        "num_active_decodes": _i32(sep.num_active_decodes),
        "dense_route": _i32(int(dense)),
        "prefill_request_ids": _i32(list(sep.prefill_request_ids)),
        "prefill_chunks": _i32([list(c) for c in sep.chunks], (len(sep.chunks), 2)),
        "workspace_starts": _i32(list(sep.workspace_starts)),
        "prefill_chunk_seq_tot": _i32(list(sep.chunk_seq_tot)),
        "context_chunk": _i32(plan.chunk),
        "context_starts": _i32([list(r) for r in plan.starts], (n_ctx, n_pre)),
        "context_lens": _i32([list(r) for r in plan.lens], (n_ctx, n_pre)),
        "context_cu_seq_lens": _i32([list(r) for r in plan.cu_seq_lens], (n_ctx, n_pre + 1)),
        "context_seq_tot": _i32(list(plan.seq_tot)),
        "context_requests": _i32([list(r) for r in requests], (n_ctx, 2)),
    }
    return StepMetadata(
        outputs=outputs,
        num_decodes=nd,
        num_decode_tokens=ndt,
        dense=dense,
        prefills=prefills,
        context_lens=ctx,
        seq_lens=list(sl),
        prefill_request_ids=list(sep.prefill_request_ids),
        workspace_starts=list(sep.workspace_starts),
    )


def step_oracle(
    *,
    kv_cache: Tensor,
    block_table: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    req_id_per_token: Tensor,
    topk_indices: Tensor,
    num_tokens: int,
    threshold: int,
    require_uniform: bool,
    workspace_rows: int,
    topk: int,
    context_chunks: str = "equal_width",
    dcp_world_size: int = 1,
    dcp_interleave: int = 1,
    loop: bool = False,
) -> dict[str, Tensor]:
    """Every output of the step pipeline (module docstring)."""
    conv_fn: Callable = convert_loop if loop else convert
    rows_fn: Callable = sequence_rows_loop if loop else sequence_rows

    # The step's metadata crosses to the host in one sync, and the cache in one more (issue 29).
    q_host, sl_host, table, req_id, idx = host_copies(
        query_start_loc, seq_lens, block_table, req_id_per_token, topk_indices
    )
    kv_cache = kv_cache.cpu()
    bs = as_record_bytes(kv_cache).shape[1]
    meta = step_metadata(
        query_start_loc=q_host.tolist(),
        seq_lens=sl_host.tolist(),
        block_size=bs,
        num_tokens=num_tokens,
        threshold=threshold,
        require_uniform=require_uniform,
        workspace_rows=workspace_rows,
        topk=topk,
        context_chunks=context_chunks,
        dcp_world_size=dcp_world_size,
        dcp_interleave=dcp_interleave,
        loop=loop,
    )
    ndt, prefills, sl = meta.num_decode_tokens, meta.prefills, meta.seq_lens

    decode_slots, _ = conv_fn(req_id=req_id[:ndt], block_table=table, token_indices=idx[:ndt], block_size=bs)
    empty_rows = torch.empty((0, ROW_DIM), dtype=torch.bfloat16)
    if meta.dense:
        prefill_slots = torch.empty((0, topk), dtype=torch.int32)
        context_rows = rows_fn(kv_cache=kv_cache, block_table=table, requests=prefills, lengths=meta.context_lens)
        seq_rows = empty_rows
    else:
        prefill_slots, _ = conv_fn(
            req_id=req_id[ndt:],
            block_table=table,
            token_indices=idx[ndt:],
            block_size=bs,
            has_prefill_workspace=True,
            prefill_workspace_request_ids=_i32(meta.prefill_request_ids[ndt:]),
            prefill_workspace_starts=_i32(meta.workspace_starts),
        )
        context_rows = empty_rows
        seq_rows = rows_fn(kv_cache=kv_cache, block_table=table, requests=prefills, lengths=[sl[r] for r in prefills])

    return {
        **meta.outputs,
        "decode_slots": decode_slots.to(torch.int32),
        "prefill_slots": prefill_slots.to(torch.int32),
        "context_rows": context_rows,
        "prefill_seq_rows": seq_rows,
    }
