"""Oracles for the step metadata (SPEC.md sections 5.1 to 5.3).

Section 5.3 lives in `fp8_separate.py` (file size) and is re-exported here.

Each builder comes twice: `*_loop` follows the SPEC prose request by request;
the unsuffixed one is a second, independent formulation (torch reductions,
or a different loop shape) so the property tests can hold them to each
other. All results are plain Python ints and tuples in frozen dataclasses,
hashable and device-free; `ChunkedContext.tensors` gives the int32 tensors a
gather call takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mlafuzz.oracles._seq import IntSeq
from mlafuzz.oracles._seq import ints as _ints
from mlafuzz.oracles.fp8_separate import (
    Fp8SeparateMetadata,
    fp8_separate_metadata,
    fp8_separate_metadata_loop,
)

__all__ = [
    "split_decodes_and_prefills_loop",
    "split_decodes_and_prefills",
    "ChunkedContext",
    "chunked_context_loop",
    "chunked_context",
    "chunked_context_rows",
    "chunked_context_violations",
    "Fp8SeparateMetadata",
    "fp8_separate_metadata_loop",
    "fp8_separate_metadata",
]

# ------------------------------------------------------------------ 5.1 split


def _query_lens(query_start_loc: IntSeq) -> list[int]:
    qsl = _ints(query_start_loc, "query_start_loc")
    if not qsl:
        raise ValueError("query_start_loc is empty: expected [R+1]")
    lens = [qsl[r + 1] - qsl[r] for r in range(len(qsl) - 1)]
    if any(q < 0 for q in lens):
        raise ValueError(f"query_start_loc={qsl} is not non-decreasing")
    return lens


def split_decodes_and_prefills_loop(
    *,
    query_start_loc: IntSeq,
    threshold: int,
    require_uniform: bool,
    num_tokens: int | None = None,
) -> tuple[int, int, int, int]:
    """SPEC 5.1, rule by rule. Returns (num_decodes, num_prefills,
    num_decode_tokens, num_prefill_tokens).

    num_tokens defaults to query_start_loc[-1] (vLLM passes
    num_actual_tokens, which may include CUDA-graph padding). Readings: R == 0
    gives (0, 0, 0, 0); the uniform all-decodes case with num_tokens != R *
    query_len[0] is vLLM's failed assertion and raises ValueError. With
    require_uniform, a zero-length request only counts as padding when the
    whole batch is uniform; otherwise it differs from query_len[0] and so can
    start the prefills, as in vLLM.
    """
    qsl = _ints(query_start_loc, "query_start_loc")
    lens = _query_lens(qsl)
    n_req = len(lens)
    t = qsl[-1] if num_tokens is None else num_tokens
    if n_req == 0:
        return 0, 0, 0, 0
    if max(lens) <= threshold and (not require_uniform or threshold <= 1):
        return n_req, 0, t, 0
    if lens[0] > threshold:
        return 0, n_req, 0, t
    if require_uniform:
        if all(q == lens[0] or q == 0 for q in lens):
            if t != n_req * lens[0]:
                raise ValueError(f"tokens not padded correctly: num_tokens={t} != R*query_len[0]={n_req}*{lens[0]}")
            return n_req, 0, t, 0
        first = next(r for r in range(n_req) if lens[r] != lens[0])
    else:
        first = next(r for r in range(n_req) if lens[r] > threshold)
    return first, n_req - first, qsl[first], t - qsl[first]


def split_decodes_and_prefills(
    *,
    query_start_loc: IntSeq,
    threshold: int,
    require_uniform: bool,
    num_tokens: int | None = None,
) -> tuple[int, int, int, int]:
    """SPEC 5.1 with torch reductions (argmax of a prefill mask), the same
    readings as `split_decodes_and_prefills_loop`."""
    qsl_list = _ints(query_start_loc, "query_start_loc")
    _query_lens(qsl_list)  # validates
    qsl = torch.tensor(qsl_list, dtype=torch.int64)
    lens = qsl[1:] - qsl[:-1]
    n_req = int(lens.numel())
    t = int(qsl[-1]) if num_tokens is None else num_tokens
    if n_req == 0:
        return 0, 0, 0, 0
    q0 = int(lens[0])
    if int(lens.max()) <= threshold and (not require_uniform or threshold <= 1):
        return n_req, 0, t, 0
    if q0 > threshold:
        return 0, n_req, 0, t
    if require_uniform:
        if bool(((lens == q0) | (lens == 0)).all()):
            if t != n_req * q0:
                raise ValueError(f"tokens not padded correctly: num_tokens={t} != R*query_len[0]={n_req}*{q0}")
            return n_req, 0, t, 0
        is_prefill = lens != q0
    else:
        is_prefill = lens > threshold
    first = int(is_prefill.to(torch.int32).argmax())
    nd_tokens = int(qsl[first])
    return first, n_req - first, nd_tokens, t - nd_tokens


# --------------------------------------------------------- 5.2 chunked context


@dataclass(frozen=True)
class ChunkedContext:
    """Chunked prefill context plan (SPEC 5.2), all fields plain ints.

    n_requests: R; chunk: rows per request per chunk; n_chunks: number of
    chunks; starts/lens: [n_chunks][R]; cu_seq_lens: [n_chunks][R+1];
    seq_tot: [n_chunks]. With no request having context, chunk = n_chunks =
    0 and the per-chunk fields are empty.
    """

    n_requests: int
    chunk: int
    n_chunks: int
    starts: tuple[tuple[int, ...], ...]
    lens: tuple[tuple[int, ...], ...]
    cu_seq_lens: tuple[tuple[int, ...], ...]
    seq_tot: tuple[int, ...]

    def tensors(self, *, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(starts, lens, cu_seq_lens, seq_tot) as int32 tensors of shapes
        [n_chunks, R], [n_chunks, R], [n_chunks, R+1], [n_chunks]."""
        n_req = self.n_requests

        def mk(rows: object, width: int) -> Tensor:
            t = torch.tensor(rows, dtype=torch.int32, device=device)
            return t.reshape(self.n_chunks, width)

        return (
            mk(self.starts, n_req),
            mk(self.lens, n_req),
            mk(self.cu_seq_lens, n_req + 1),
            torch.tensor(self.seq_tot, dtype=torch.int32, device=device).reshape(self.n_chunks),
        )


def _chunk_size(ctx: list[int], workspace_rows: int, block_size: int) -> int:
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    if workspace_rows < 0:
        raise ValueError(f"workspace_rows={workspace_rows}: must be >= 0")
    if any(c < 0 for c in ctx):
        raise ValueError(f"context_lens={ctx}: must be >= 0")
    with_ctx = sum(1 for c in ctx if c > 0)
    if with_ctx == 0:
        return 0
    chunk = (workspace_rows // with_ctx) // block_size * block_size
    if chunk == 0:
        raise ValueError(
            f"chunk=0: workspace_rows={workspace_rows} // requests_with_context="
            f"{with_ctx}, rounded down to block_size={block_size}"
        )
    return chunk


def chunked_context_loop(*, context_lens: IntSeq, workspace_rows: int, block_size: int) -> ChunkedContext:
    """SPEC 5.2 in the words of the SPEC: chunk = W // #(ctx > 0) rounded
    down to a multiple of bs (requests without context are not in the
    divisor), n_chunks = ceil(max(ctx) / chunk), starts[i][r] = i * chunk,
    lens[i][r] = max(0, min(ctx[r], start + chunk) - start). Raises
    ValueError when chunk rounds down to 0."""
    ctx = _ints(context_lens, "context_lens")
    chunk = _chunk_size(ctx, workspace_rows, block_size)
    if chunk == 0:
        return ChunkedContext(n_requests=len(ctx), chunk=0, n_chunks=0, starts=(), lens=(), cu_seq_lens=(), seq_tot=())
    n_chunks = -(-max(ctx) // chunk)
    starts, lens, cus, tots = [], [], [], []
    for i in range(n_chunks):
        s_row = [i * chunk for _ in ctx]
        l_row = [max(0, min(c, s + chunk) - s) for c, s in zip(ctx, s_row)]
        cu = [0]
        for ln in l_row:
            cu.append(cu[-1] + ln)
        starts.append(tuple(s_row))
        lens.append(tuple(l_row))
        cus.append(tuple(cu))
        tots.append(sum(l_row))
    return ChunkedContext(
        n_requests=len(ctx),
        chunk=chunk,
        n_chunks=n_chunks,
        starts=tuple(starts),
        lens=tuple(lens),
        cu_seq_lens=tuple(cus),
        seq_tot=tuple(tots),
    )


def chunked_context(*, context_lens: IntSeq, workspace_rows: int, block_size: int) -> ChunkedContext:
    """SPEC 5.2 as whole-array torch ops (arange x chunk, clamp, cumsum),
    the formulation vLLM's builder uses; equal to `chunked_context_loop`."""
    ctx_list = _ints(context_lens, "context_lens")
    chunk = _chunk_size(ctx_list, workspace_rows, block_size)
    if chunk == 0:
        return ChunkedContext(
            n_requests=len(ctx_list),
            chunk=0,
            n_chunks=0,
            starts=(),
            lens=(),
            cu_seq_lens=(),
            seq_tot=(),
        )
    ctx = torch.tensor(ctx_list, dtype=torch.int64)
    n_chunks = int((ctx.max() + chunk - 1) // chunk)
    starts = (torch.arange(n_chunks, dtype=torch.int64) * chunk).unsqueeze(1).expand(-1, ctx.numel())
    ends = torch.minimum(ctx.unsqueeze(0), starts + chunk)
    lens = (ends - starts).clamp(min=0)
    cu = torch.zeros(n_chunks, ctx.numel() + 1, dtype=torch.int64)
    cu[:, 1:] = torch.cumsum(lens, dim=1)

    def tup(t: Tensor) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(r) for r in t.tolist())

    return ChunkedContext(
        n_requests=len(ctx_list),
        chunk=chunk,
        n_chunks=n_chunks,
        starts=tup(starts),
        lens=tup(lens),
        cu_seq_lens=tup(cu),
        seq_tot=tuple(lens.sum(dim=1).tolist()),
    )


def chunked_context_rows(*, context_lens: IntSeq, chunked: ChunkedContext) -> list[list[tuple[int, int]]]:
    """Per chunk, the (request, context position) that each workspace row
    holds, in workspace row order: row cu_seq_lens[i][r] + j of chunk i is
    position starts[i][r] + j of request r -- exactly what the chunk's gather
    call (workspace_starts=cu_seq_lens[i], seq_starts=starts[i]) writes."""
    n_req = len(_ints(context_lens, "context_lens"))
    out: list[list[tuple[int, int]]] = []
    for i in range(chunked.n_chunks):
        rows: list[tuple[int, int]] = []
        for r in range(n_req):
            if len(rows) != chunked.cu_seq_lens[i][r]:
                raise ValueError(f"cu_seq_lens[{i}][{r}]={chunked.cu_seq_lens[i][r]} != rows so far")
            rows.extend((r, chunked.starts[i][r] + j) for j in range(chunked.lens[i][r]))
        out.append(rows)
    return out


def chunked_context_violations(*, context_lens: IntSeq, chunked: ChunkedContext, workspace_rows: int) -> list[str]:
    """The pipeline invariant of SPEC 5.2, as a list of broken clauses ([]
    when it holds): over all chunks each context token of each request
    appears exactly once and in order; no chunk needs more than
    workspace_rows rows; seq_tot matches the rows."""
    ctx = _ints(context_lens, "context_lens")
    bad: list[str] = []
    seen: list[list[int]] = [[] for _ in ctx]
    for i, rows in enumerate(chunked_context_rows(context_lens=ctx, chunked=chunked)):
        if len(rows) > workspace_rows:
            bad.append(f"chunk {i} needs {len(rows)} rows > workspace_rows={workspace_rows}")
        if chunked.seq_tot[i] != len(rows):
            bad.append(f"seq_tot[{i}]={chunked.seq_tot[i]} != {len(rows)} rows")
        for r, p in rows:
            seen[r].append(p)
    for r, c in enumerate(ctx):
        if seen[r] != list(range(c)):
            bad.append(f"request {r}: positions {seen[r][:8]}... != 0..{c - 1} in order")
    return bad
