"""Our step pipeline (SPEC.md section 5) as vLLM runs it, as an implementation under test.

``step(...)`` takes one scheduler step's tensors and the ``convert`` (SPEC 3)
and ``gather`` (SPEC 4) implementations to call, and returns every piece of
metadata it built plus what its kernel calls produced:

1. split the batch ONCE (5.1); everything else takes these counts;
2. the FP8 separate metadata (5.3): decode_query_len, active decodes,
   prefill_request_ids, greedy prefill chunks, workspace_starts restarting
   at 0 per chunk;
3. the chunked-context plan over the prefill side's contexts, by the revision's
   ``context_chunks`` rule: equal-width chunks (5.2), or the packing planner
   (9.1, revision 2026-10 on) that the step is handed as ``plan``, called as
   vLLM's call site calls it without DCP (B = W, max_context_chunk =
   round_down(W, bs), split_alignment = bs, padded_rows the identity);
4. route (5.4): dense when every prefill has seq_len <= K, else sparse;
5. convert the decode subset only: ``req_id_per_token[:num_decode_tokens]``
   with ``topk_indices[:num_decode_tokens]``; on the sparse route also the
   prefill rows, to workspace offsets (HAS_PREFILL_WORKSPACE);
6. dense route: gather each context chunk into a workspace of
   ``workspace_rows`` rows (SPEC 9.1's call: the chunk's row slice of the
   prefill block table, its ``[n+1]`` cu_seq_lens from 0, batch_size n, its
   starts as seq_starts; an equal-width chunk spans every prefill) and hand
   each prefill request its context rows, in order; sparse route:
   gather each 5.3 chunk's whole sequences (seq_starts=None).

Metadata is built on the host from int lists (vLLM builds it from the
``*_cpu`` copies). Written from SPEC, independently of ``mlafuzz.oracles``.
Stages are methods so the planted-bug mutants (kernels/mutants/step_bugs.py) override
exactly one.

Choice where SPEC is silent: a 5.3 prefill longer than the workspace gets a
chunk of its own (vLLM asserts) and the workspace grows to hold it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from mlafuzz.kernels.entry import ImplEntry, module_attr
from mlafuzz.kernels.revisions import rule
from mlafuzz.oracles import revisions
from mlafuzz.oracles.formats.table import get as get_format

__all__ = ["STEP_ENTRIES", "Fp8Separate", "Split", "StepPipeline", "step", "step_entry"]

ROW = get_format("fp8_ds_mla").row_dim  # bf16 values in a dequantized row


@dataclass(frozen=True)
class Split:
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int


@dataclass(frozen=True)
class Fp8Separate:
    split: Split
    decode_query_len: int
    num_active_decodes: int
    prefill_request_ids: list[int]  # [T]
    chunks: list[tuple[int, int]]  # prefill-local [start, end)
    workspace_starts: list[int]  # [num_prefills], restarting at 0 per chunk
    chunk_seq_tot: list[int]


@dataclass(frozen=True)
class ContextPlan:
    chunk: int
    starts: list[list[int]]  # [n_chunks][P]; 0 for a request outside the chunk
    lens: list[list[int]]  # 0 for a request outside the chunk
    cu_seq_lens: list[list[int]]  # [n_chunks][P+1]: a chunk's own [n+1] is [request_start : request_end + 1]
    seq_tot: list[int]
    requests: list[tuple[int, int]]  # [n_chunks]: the prefill-local request range [start, end)


@dataclass(frozen=True)
class Dcp:
    """Decode-context parallelism of the context gather (SPEC 9.1), simulated on one device: every
    rank's cache in one pool, rank k's block table in rows [k*R, (k+1)*R) of ``table``."""

    world: int
    interleave: int
    cache: Tensor
    table: Tensor

    def padded_rows(self, rows: int) -> int:
        return -(-rows // (self.world * self.interleave)) * self.interleave


def _chunk_fields(chunk: object) -> tuple[int, int, list[int], list[int]]:
    """request_start, request_end, starts, seq_lens of a planner's chunk (an object with those
    attributes, as vLLM's and ours return, or a mapping)."""
    get = chunk.__getitem__ if isinstance(chunk, dict) else lambda k: getattr(chunk, k)
    return (
        int(get("request_start")),
        int(get("request_end")),
        [int(x) for x in get("starts")],
        [int(x) for x in get("seq_lens")],
    )


def _flat(values: object) -> list[int]:
    """An int, or (nested) lists and tuples of ints, as one flat list."""
    if not isinstance(values, (list, tuple)):
        return [int(values)]  # type: ignore[call-overload]
    if not any(isinstance(v, (list, tuple)) for v in values):
        return [int(v) for v in values]
    return [x for v in values for x in _flat(v)]


def _uploaded(host: dict[str, tuple[object, tuple[int, ...]]], device: torch.device) -> dict[str, Tensor]:
    """Host ints (name -> (values, shape)) as int32 tensors on ``device``, views of one tensor made
    and copied once: the step's metadata is 17 small tensors and its gathers' arguments a few per
    chunk, and a copy each stops a run with several workers on one GPU scaling (issue 29). To a
    GPU the copy leaves from pinned memory without waiting: a copy from pageable memory waits for
    the stream (a host sync); torch's caching host allocator keeps the pinned block until the copy
    has read it."""
    sizes, flat = [], []
    for values, _ in host.values():
        ints = _flat(values)
        sizes.append(len(ints))
        flat += ints
    whole = torch.tensor(flat, dtype=torch.int32)
    if device.type == "cuda":
        whole = whole.pin_memory().to(device, non_blocking=True)
    else:
        whole = whole.to(device)
    return {name: part.reshape(shape) for (name, (_, shape)), part in zip(host.items(), whole.split(sizes))}


class StepPipeline:
    """The correct pipeline; each mutant overrides one stage."""

    # -- 5.1 ----------------------------------------------------------------
    def split(self, qsl: list[int], num_tokens: int, threshold: int, require_uniform: bool) -> Split:
        """vLLM's split_decodes_and_prefills on a reordered batch."""
        q = torch.tensor(qsl, dtype=torch.int64)
        lens = q[1:] - q[:-1]
        n = int(lens.numel())
        if n == 0:
            return Split(0, 0, 0, 0)
        if int(lens.max()) <= threshold and (not require_uniform or threshold <= 1):
            return Split(n, 0, num_tokens, 0)
        if int(lens[0]) > threshold:
            return Split(0, n, 0, num_tokens)
        if require_uniform:
            padded = (lens == lens[0]) | (lens == 0)
            if bool(padded.all()):
                if n * int(lens[0]) != num_tokens:
                    raise ValueError(
                        f"tokens not padded correctly: num_tokens={num_tokens} != {n} * query_len[0]={int(lens[0])}"
                    )
                return Split(n, 0, num_tokens, 0)
            is_prefill = lens != lens[0]
        else:
            is_prefill = lens > threshold
        first = int(torch.argmax(is_prefill.to(torch.int32)))
        return Split(first, n - first, qsl[first], num_tokens - qsl[first])

    # -- 5.3 ----------------------------------------------------------------
    def fp8_separate(
        self,
        *,
        split: Split,
        qsl: list[int],
        seq_lens: list[int],
        num_tokens: int,
        workspace_rows: int,
        threshold: int,
        require_uniform: bool,
    ) -> Fp8Separate:
        nd = split.num_decodes
        dql = qsl[1] - qsl[0] if nd else 0
        active = split.num_decode_tokens // dql if dql > 0 else 0
        ids = [-1] * num_tokens
        for k, r in enumerate(range(nd, len(seq_lens))):
            ids[qsl[r] : qsl[r + 1]] = [k] * (qsl[r + 1] - qsl[r])
        lens = seq_lens[nd:]
        chunks: list[tuple[int, int]] = []
        start = 0
        while start < len(lens):
            end, used = start + 1, lens[start]  # a chunk holds at least one prefill
            while end < len(lens) and used + lens[end] <= workspace_rows:
                used += lens[end]
                end += 1
            chunks.append((start, end))
            start = end
        return Fp8Separate(
            split=split,
            decode_query_len=dql,
            num_active_decodes=active,
            prefill_request_ids=ids,
            chunks=chunks,
            workspace_starts=self.workspace_starts(lens, chunks),
            chunk_seq_tot=[sum(lens[s:e]) for s, e in chunks],
        )

    def workspace_starts(self, lens: list[int], chunks: list[tuple[int, int]]) -> list[int]:
        """Exclusive prefix sum of seq_lens within each chunk, restarting at 0."""
        return [x for s, e in chunks for x in itertools.accumulate([0] + lens[s : e - 1])]

    # -- 5.2 ----------------------------------------------------------------
    def chunked_context(self, ctx: list[int], workspace_rows: int, block_size: int) -> ContextPlan:
        with_ctx = sum(1 for c in ctx if c > 0)
        if with_ctx == 0:
            return ContextPlan(0, [], [], [], [], [])
        chunk = (workspace_rows // with_ctx) // block_size * block_size
        if chunk <= 0:
            raise ValueError(
                f"workspace_rows={workspace_rows} leaves no block per request with context "
                f"({with_ctx} requests, block_size={block_size})"
            )
        n_chunks = -(-max(ctx) // chunk)
        starts = [[i * chunk] * len(ctx) for i in range(n_chunks)]
        lens = [[max(0, min(c, s + chunk) - s) for c, s in zip(ctx, row)] for row in starts]
        cu = [list(itertools.accumulate([0] + row)) for row in lens]
        return ContextPlan(chunk, starts, lens, cu, [sum(row) for row in lens], [(0, len(ctx))] * n_chunks)

    # -- 9.1 ----------------------------------------------------------------
    def planned_context(
        self, ctx: list[int], workspace_rows: int, block_size: int, plan: Callable, dcp: Dcp | None = None
    ) -> ContextPlan:
        """The packing planner's chunks, asked for as vLLM's call site asks: B = W, alignment bs,
        rows = tokens; under DCP B = W // D, alignment lcm(bs, D*I), rows = ceil(r / (D*I)) * I."""
        align = block_size if dcp is None else math.lcm(block_size, dcp.world * dcp.interleave)
        budget = workspace_rows if dcp is None else workspace_rows // dcp.world
        cap = workspace_rows // align * align
        if cap <= 0:
            raise ValueError(f"workspace_rows={workspace_rows} holds no piece of the alignment {align}")
        rows = (lambda r: r) if dcp is None else dcp.padded_rows
        chunks = [_chunk_fields(c) for c in plan(list(ctx), budget, cap, align, rows)]
        starts = [[0] * len(ctx) for _ in chunks]
        lens = [[0] * len(ctx) for _ in chunks]
        for i, (rs, re_, st, sl) in enumerate(chunks):
            starts[i][rs:re_], lens[i][rs:re_] = st, sl
        cu = [list(itertools.accumulate([0] + row)) for row in lens]
        return ContextPlan(cap, starts, lens, cu, [sum(row) for row in lens], [(c[0], c[1]) for c in chunks])

    # -- 5.4 ----------------------------------------------------------------
    def dense_route(self, prefill_seq_lens: list[int], topk: int) -> bool:
        """Dense prefill when every prefill's sequence fits in K (none: dense)."""
        return all(s <= topk for s in prefill_seq_lens)

    def decode_req_id(self, req_id_per_token: Tensor, num_decode_tokens: int, num_decodes: int) -> Tensor:
        return req_id_per_token[:num_decode_tokens]

    def context_seq_starts(self, starts_row: Tensor) -> Tensor | None:
        return starts_row

    def context_table(self, prefill_table: Tensor, request_start: int, request_end: int) -> Tensor:
        """A chunk's rows of the prefill block table (a row-slice view, SPEC 9.1)."""
        return prefill_table[request_start:request_end]

    # -- the step -----------------------------------------------------------
    def __call__(
        self,
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
        block_n: int,
        convert: Callable,
        gather: Callable,
        plan: Callable | None = None,
        dcp_world_size: int = 1,
        dcp_interleave: int = 1,
        dcp_kv_cache: Tensor | None = None,
        dcp_block_table: Tensor | None = None,
        revision: str = revisions.newest(),
    ) -> dict[str, Tensor]:
        dev = topk_indices.device
        bs = kv_cache.shape[1]
        # Both read to the host together (one sync on a GPU, not two).
        both = torch.cat([query_start_loc.reshape(-1), seq_lens.reshape(-1)]).tolist()
        qsl, sl = both[: query_start_loc.numel()], both[query_start_loc.numel() :]
        split = self.split(qsl, num_tokens, threshold, require_uniform)  # resolved once (5.1)
        sep = self.fp8_separate(
            split=split,
            qsl=qsl,
            seq_lens=sl,
            num_tokens=num_tokens,
            workspace_rows=workspace_rows,
            threshold=threshold,
            require_uniform=require_uniform,
        )
        nd, n_pre = sep.split.num_decodes, sep.split.num_prefills
        ctx = [sl[r] - (qsl[r + 1] - qsl[r]) for r in range(nd, len(sl))]
        dcp = None
        if rule(revision, "context_chunks") == "packing_planner":  # SPEC 9.1 (2026-10 on)
            if plan is None:
                raise ValueError(f"revision {revision} plans context chunks with the packing planner: pass plan=")
            if dcp_world_size > 1:
                if dcp_kv_cache is None or dcp_block_table is None:
                    raise ValueError(f"dcp_world_size={dcp_world_size}: pass dcp_kv_cache= and dcp_block_table=")
                dcp = Dcp(dcp_world_size, dcp_interleave, dcp_kv_cache, dcp_block_table)
            ctx_plan = self.planned_context(ctx, workspace_rows, bs, plan, dcp)
        else:  # equal_width, SPEC 5.2 (DCP is the planner's)
            ctx_plan = self.chunked_context(ctx, workspace_rows, bs)
        dense = self.dense_route(sl[nd:], topk)
        convert_kw = dict(BLOCK_SIZE=bs, NUM_TOPK_TOKENS=topk, BLOCK_N=block_n)

        ndt = split.num_decode_tokens
        decode_slots = torch.empty((0, topk), dtype=torch.int32, device=dev)
        if ndt > 0:  # SPEC 5.4: the decode subset only
            decode_slots = convert(
                self.decode_req_id(req_id_per_token, ndt, nd), block_table, topk_indices[:ndt], **convert_kw
            )
        prefill_slots = torch.empty((0, topk), dtype=torch.int32, device=dev)
        context_rows = torch.empty((0, ROW), dtype=torch.bfloat16, device=dev)
        seq_rows = torch.empty((0, ROW), dtype=torch.bfloat16, device=dev)
        biggest = max([workspace_rows] + sep.chunk_seq_tot + ctx_plan.seq_tot)
        workspace = torch.empty((biggest, ROW), dtype=torch.bfloat16, device=dev)
        prefill_table = block_table[nd:]
        if dense and dcp is not None:
            rows_per_rank = len(sl)
            tables = [dcp.table[k * rows_per_rank + nd : (k + 1) * rows_per_rank] for k in range(dcp.world)]
            context_rows = self._gather_context_dcp(dcp, workspace, tables, ctx_plan, n_pre, gather)
        elif dense:
            context_rows = self._gather_context(kv_cache, workspace, prefill_table, ctx_plan, n_pre, gather)
        else:
            pdt = sep.split.num_decode_tokens
            ids, starts = _uploaded(
                {"ids": (sep.prefill_request_ids[pdt:], (-1,)), "starts": (sep.workspace_starts, (-1,))}, dev
            ).values()
            prefill_slots = convert(
                req_id_per_token[pdt:],
                block_table,
                topk_indices[pdt:],
                **convert_kw,
                HAS_PREFILL_WORKSPACE=True,
                prefill_workspace_request_ids=ids,
                prefill_workspace_starts=starts,
            )
            seq_rows = self._gather_sequences(kv_cache, workspace, prefill_table, sep, gather)
        return self._outputs(
            sep=sep,
            plan=ctx_plan,
            dense=dense,
            n_pre=n_pre,
            dev=dev,
            decode_slots=decode_slots,
            prefill_slots=prefill_slots,
            context_rows=context_rows,
            prefill_seq_rows=seq_rows,
        )

    def _gather_context(
        self, cache: Tensor, workspace: Tensor, table: Tensor, plan: ContextPlan, n_pre: int, gather: Callable
    ) -> Tensor:
        """One gather per chunk, over its requests [rs, re): the table's row slice, its [n+1]
        cu_seq_lens from 0, its starts; request r's rows of chunk i follow its rows of chunk i-1."""
        dev = workspace.device
        per_request: list[list[Tensor]] = [[] for _ in range(n_pre)]
        args = _uploaded(  # every chunk's arguments in one copy
            {
                f"{key}{i}": (values, (-1,))
                for i, (rs, re_) in enumerate(plan.requests)
                for key, values in (("cu", plan.cu_seq_lens[i][rs : re_ + 1]), ("starts", plan.starts[i][rs:re_]))
            },
            dev,
        )
        for i, total in enumerate(plan.seq_tot):
            rs, re_ = plan.requests[i]
            dst = workspace[:total]
            cu, starts = args[f"cu{i}"], args[f"starts{i}"]
            gather(cache, dst, self.context_table(table, rs, re_), cu, re_ - rs, self.context_seq_starts(starts))
            kept = dst.clone()  # the next chunk's gather overwrites the workspace: one copy per chunk
            for r in range(rs, re_):
                lo = plan.cu_seq_lens[i][r]
                per_request[r].append(kept[lo : lo + plan.lens[i][r]])
        rows = [t for ts in per_request for t in ts]
        return torch.cat(rows) if rows else torch.empty((0, ROW), dtype=torch.bfloat16, device=dev)

    def _gather_context_dcp(
        self, dcp: Dcp, workspace: Tensor, tables: list[Tensor], plan: ContextPlan, n_pre: int, gather: Callable
    ) -> Tensor:
        """Under DCP each rank gathers its own rows of a chunk: request r's slice [s, s+n) is local
        rows [padded(s), padded(s+n)) there, from padded(s) (the local start). The ranks' rows are
        put back in position order: position p is rank (p // I) % D's local row (p // (D*I)) * I +
        p % I."""
        dev = workspace.device
        world = dcp.world
        pieces: list[list[Tensor]] = [[] for _ in range(n_pre)]
        local: dict[int, tuple[list[int], list[int]]] = {}  # chunk -> (its local starts, cu_seq_lens)
        for i, (rs, re_) in enumerate(plan.requests):
            starts, lens = plan.starts[i][rs:re_], plan.lens[i][rs:re_]
            local_starts = [dcp.padded_rows(s) for s in starts]
            local_lens = [dcp.padded_rows(s + n) - ls for s, n, ls in zip(starts, lens, local_starts)]
            local[i] = local_starts, list(itertools.accumulate([0] + local_lens))
        args = _uploaded(  # every chunk's and rank's arguments in one copy (each call its own tensors)
            {
                **{
                    f"{key}{i}.{k}": (values, (-1,))
                    for i, (local_starts, cu) in local.items()
                    for k in range(world)
                    for key, values in (("cu", cu), ("starts", local_starts))
                },
                **{f"order{i}": (self._position_order(dcp, plan, i, *local[i]), (-1,)) for i in local},
            },
            dev,
        )
        for i in range(len(plan.seq_tot)):
            rs, re_ = plan.requests[i]
            lens, cu = plan.lens[i][rs:re_], local[i][1]
            ranks = []
            for k in range(world):
                dst = workspace[: cu[-1]]
                cu_dev, starts_dev = args[f"cu{i}.{k}"], args[f"starts{i}.{k}"]
                gather(
                    dcp.cache,
                    dst,
                    self.context_table(tables[k], rs, re_),
                    cu_dev,
                    re_ - rs,
                    self.context_seq_starts(starts_dev),
                )
                ranks.append(dst.clone())  # each rank has a workspace of its own
            # The chunk's rows in position order, request after request, in one index of the ranks' rows.
            ordered = torch.stack(ranks).reshape(-1, ROW).index_select(0, args[f"order{i}"])
            for j, part in enumerate(ordered.split(lens)):
                pieces[rs + j].append(part)
        rows = [t for ts in pieces for t in ts]
        return torch.cat(rows) if rows else torch.empty((0, ROW), dtype=torch.bfloat16, device=dev)

    @staticmethod
    def _position_order(dcp: Dcp, plan: ContextPlan, i: int, local_starts: list[int], cu: list[int]) -> list[int]:
        """Chunk i's positions, request after request, as rows of its ranks' stacked workspaces
        [D, cu[-1]]: position p of a request is rank (p // I) % D's local row (p // (D*I)) * I +
        p % I, at cu[j] - padded(s) past the request's first local row."""
        world, inter = dcp.world, dcp.interleave
        rs, re_ = plan.requests[i]
        order = [np.zeros(0, dtype=np.int64)]
        for j, (s, n, ls) in enumerate(zip(plan.starts[i][rs:re_], plan.lens[i][rs:re_], local_starts)):
            p = np.arange(s, s + n, dtype=np.int64)
            row = cu[j] + (p // (world * inter)) * inter + p % inter - ls
            order.append((p // inter) % world * cu[-1] + row)
        return np.concatenate(order).tolist()

    def _gather_sequences(
        self, cache: Tensor, workspace: Tensor, table: Tensor, sep: Fp8Separate, gather: Callable
    ) -> Tensor:
        """Sparse route: each 5.3 chunk's prefills, whole sequences, at their workspace_starts."""
        dev = workspace.device
        out = []
        starts = _uploaded({str(i): (sep.workspace_starts[s:e], (-1,)) for i, (s, e) in enumerate(sep.chunks)}, dev)
        for i, ((s, e), total) in enumerate(zip(sep.chunks, sep.chunk_seq_tot)):
            dst = workspace[:total]
            gather(cache, dst, table[s:e], starts[str(i)], e - s, None)
            out.append(dst.clone())
        return torch.cat(out) if out else torch.empty((0, ROW), dtype=torch.bfloat16, device=dev)

    @staticmethod
    def _outputs(
        *, sep: Fp8Separate, plan: ContextPlan, dense: bool, n_pre: int, dev: torch.device, **tensors: Tensor
    ) -> dict[str, Tensor]:
        s = sep.split
        n_ctx = len(plan.seq_tot)
        host = {
            "num_decodes": (s.num_decodes, ()),
            "num_prefills": (s.num_prefills, ()),
            "num_decode_tokens": (s.num_decode_tokens, ()),
            "num_prefill_tokens": (s.num_prefill_tokens, ()),
            "decode_query_len": (sep.decode_query_len, ()),
            "num_active_decodes": (sep.num_active_decodes, ()),
            "dense_route": (int(dense), ()),
            "prefill_request_ids": (sep.prefill_request_ids, (-1,)),
            "prefill_chunks": (sep.chunks, (len(sep.chunks), 2)),
            "workspace_starts": (sep.workspace_starts, (-1,)),
            "prefill_chunk_seq_tot": (sep.chunk_seq_tot, (-1,)),
            "context_chunk": (plan.chunk, ()),
            "context_starts": (plan.starts, (n_ctx, n_pre)),
            "context_lens": (plan.lens, (n_ctx, n_pre)),
            "context_cu_seq_lens": (plan.cu_seq_lens, (n_ctx, n_pre + 1)),
            "context_seq_tot": (plan.seq_tot, (-1,)),
            "context_requests": (plan.requests, (n_ctx, 2)),
        }
        return {**_uploaded(host, dev), **tensors}


step = StepPipeline()


# --- registry --------------------------------------------------------------


def step_entry(
    name: str, *, module: str, attr: str, description: str, kind: str | None = None, extension: bool = False
) -> ImplEntry:
    """A registry entry of a step pipeline at ``module``.``attr``: ours, or a planted bug
    (kernels/mutants/step_bugs.py) when ``kind`` names the finding it must draw."""
    # Look-alikes of reported bugs (SPEC 9.5) recall as their own group in `mutants`.
    group = ("vllm-reports" if "look-alike" in description else "core") if kind is not None else None
    return ImplEntry(
        op="step",
        name=name,
        loader=module_attr(module, attr),
        devices=frozenset({"cpu", "cuda"}),
        rejects=frozenset(),
        description=description,
        is_mutant=kind is not None,
        expected_kind=kind,
        revisions=frozenset(revisions.names()),  # the harness binds the case's revision= (context_chunks)
        group=group,
        extension=extension,  # on a GPU its gather is our CUDA kernel (unless MLAFUZZ_STEP_GATHER says otherwise)
    )


STEP_ENTRIES: tuple[ImplEntry, ...] = (
    step_entry(
        "ours",
        module=__name__,
        attr="step",
        description="our step pipeline (split once, fp8 and chunked-context metadata, decode-subset convert,"
        " chunked gather); its convert/gather sub-impls chosen by the step op",
        extension=True,
    ),
)
