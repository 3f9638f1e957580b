"""Oracle for the FP8 separate prefill/decode metadata (SPEC.md section 5.3).

Re-exported by `mlafuzz.oracles.metadata`. Inputs are the step's
query_start_loc [R+1] and seq_lens [R] plus the counts already resolved by
the section 5.1 split (num_decodes, num_decode_tokens): SPEC's point is that
they are taken as given, never recomputed with other arguments.

Readings chosen where SPEC is silent:

- decode_query_len = query_start_loc[1] - query_start_loc[0] when there are
  decodes, else 0; num_active_decodes = num_decode_tokens //
  decode_query_len, else 0. vLLM asserts decode_query_len > 0 and that the
  division is exact; the oracle raises ValueError in both cases.
- prefill k (prefill-local index) is request num_decodes + k; its tokens
  [qsl[num_decodes + k], qsl[num_decodes + k + 1]) get prefill_request_ids
  k, every other token -1; the array has num_tokens entries (default
  query_start_loc[-1]).
- Chunking is greedy over the prefills' full seq_lens (context + query): a
  chunk takes prefills while the running sum stays <= workspace_rows. A
  single prefill longer than the workspace gets a chunk of its own (vLLM
  asserts instead; the oracle keeps going so a pipeline case can still be
  described, and `chunk_seq_tot` shows the overflow). Zero-length prefills
  join the current chunk.
- workspace_starts[k] is the exclusive prefix sum of seq_lens within k's
  chunk, restarting at 0 at each chunk (vLLM's example: seq_lens
  [10, 15, 20, 5], chunks [0, 2), [2, 4) -> [0, 10, 0, 20]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlafuzz.oracles._seq import IntSeq, ints

__all__ = ["Fp8SeparateMetadata", "fp8_separate_metadata_loop", "fp8_separate_metadata"]


@dataclass(frozen=True)
class Fp8SeparateMetadata:
    """SPEC 5.3 metadata. chunks are prefill-local [start, end) request
    ranges; chunk_seq_tot the rows each chunk's gather fills;
    chunk_token_ranges the [start, end) token ranges of each chunk's
    queries."""

    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    decode_query_len: int
    num_active_decodes: int
    prefill_request_ids: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]
    workspace_starts: tuple[int, ...]
    chunk_seq_tot: tuple[int, ...]
    chunk_token_ranges: tuple[tuple[int, int], ...]


def _common(
    *,
    query_start_loc: IntSeq,
    seq_lens: IntSeq,
    num_decodes: int,
    num_decode_tokens: int,
    workspace_rows: int,
    num_tokens: int | None,
) -> tuple[list[int], list[int], int, int, int]:
    """Checks; returns (qsl, seq_lens, T, decode_query_len, num_active_decodes)."""
    qsl = ints(query_start_loc, "query_start_loc")
    sl = ints(seq_lens, "seq_lens")
    n_req = len(qsl) - 1
    if n_req < 0 or len(sl) != n_req:
        raise ValueError(f"len(seq_lens)={len(sl)} must be len(query_start_loc)-1={n_req}")
    if any(qsl[r + 1] < qsl[r] for r in range(n_req)) or any(v < 0 for v in sl):
        raise ValueError(f"query_start_loc={qsl} must be non-decreasing, seq_lens={sl} >= 0")
    if not 0 <= num_decodes <= n_req:
        raise ValueError(f"num_decodes={num_decodes}: must be in [0, {n_req}]")
    if workspace_rows < 0:
        raise ValueError(f"workspace_rows={workspace_rows}: must be >= 0")
    t = qsl[-1] if num_tokens is None else num_tokens
    if n_req and t < qsl[-1]:
        raise ValueError(f"num_tokens={t} < query_start_loc[-1]={qsl[-1]}")
    if num_decodes == 0:
        return qsl, sl, t, 0, 0
    dql = qsl[1] - qsl[0]
    if dql <= 0:
        raise ValueError(f"decode_query_len={dql}: must be > 0 when num_decodes > 0")
    if num_decode_tokens % dql:
        raise ValueError(f"num_decode_tokens={num_decode_tokens} is not a multiple of decode_query_len={dql}")
    return qsl, sl, t, dql, num_decode_tokens // dql


def _finish(
    *,
    qsl: list[int],
    t: int,
    dql: int,
    active: int,
    num_decodes: int,
    num_decode_tokens: int,
    ids: list[int],
    chunks: list[tuple[int, int]],
    starts: list[int],
    prefill_lens: list[int],
) -> Fp8SeparateMetadata:
    nd = num_decodes
    return Fp8SeparateMetadata(
        num_decodes=nd,
        num_prefills=len(qsl) - 1 - nd,
        num_decode_tokens=num_decode_tokens,
        num_prefill_tokens=t - num_decode_tokens,
        decode_query_len=dql,
        num_active_decodes=active,
        prefill_request_ids=tuple(ids),
        chunks=tuple(chunks),
        workspace_starts=tuple(starts),
        chunk_seq_tot=tuple(sum(prefill_lens[s:e]) for s, e in chunks),
        chunk_token_ranges=tuple((qsl[nd + s], qsl[nd + e]) for s, e in chunks),
    )


def fp8_separate_metadata_loop(
    *,
    query_start_loc: IntSeq,
    seq_lens: IntSeq,
    num_decodes: int,
    num_decode_tokens: int,
    workspace_rows: int,
    num_tokens: int | None = None,
) -> Fp8SeparateMetadata:
    """SPEC 5.3 in one pass over the prefills, following the prose: tokens
    are tagged per request, and each prefill either joins the open chunk (its
    seq_len still fits) or opens a new one, its workspace start being the
    open chunk's running total."""
    qsl, sl, t, dql, active = _common(
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        num_decodes=num_decodes,
        num_decode_tokens=num_decode_tokens,
        workspace_rows=workspace_rows,
        num_tokens=num_tokens,
    )
    prefill_lens = sl[num_decodes:]
    ids = [-1] * t
    for k in range(len(prefill_lens)):
        for tok in range(qsl[num_decodes + k], qsl[num_decodes + k + 1]):
            ids[tok] = k
    chunks: list[tuple[int, int]] = []
    starts: list[int] = []
    open_start, running = 0, 0
    for k, length in enumerate(prefill_lens):
        if k > open_start and running + length > workspace_rows:
            chunks.append((open_start, k))
            open_start, running = k, 0
        starts.append(running)
        running += length
    if prefill_lens:
        chunks.append((open_start, len(prefill_lens)))
    return _finish(
        qsl=qsl,
        t=t,
        dql=dql,
        active=active,
        num_decodes=num_decodes,
        num_decode_tokens=num_decode_tokens,
        ids=ids,
        chunks=chunks,
        starts=starts,
        prefill_lens=prefill_lens,
    )


def fp8_separate_metadata(
    *,
    query_start_loc: IntSeq,
    seq_lens: IntSeq,
    num_decodes: int,
    num_decode_tokens: int,
    workspace_rows: int,
    num_tokens: int | None = None,
) -> Fp8SeparateMetadata:
    """SPEC 5.3, second formulation: token tags by repeat_interleave, each
    chunk's end found by counting how many of the remaining prefills fit in
    a cumulative sum (at least one), workspace starts as the global
    exclusive prefix sum minus its value at the chunk's first prefill (what
    vLLM does in place). Equal to `fp8_separate_metadata_loop`."""
    qsl, sl, t, dql, active = _common(
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        num_decodes=num_decodes,
        num_decode_tokens=num_decode_tokens,
        workspace_rows=workspace_rows,
        num_tokens=num_tokens,
    )
    nd = num_decodes
    prefill_lens = sl[nd:]
    n_pre = len(prefill_lens)
    q = torch.tensor(qsl, dtype=torch.int64)
    ids_t = torch.full((t,), -1, dtype=torch.int64)
    if n_pre:
        lo, hi = qsl[nd], qsl[-1]
        ids_t[lo:hi] = torch.repeat_interleave(torch.arange(n_pre, dtype=torch.int64), q[nd + 1 :] - q[nd:-1])
    lens_t = torch.tensor(prefill_lens, dtype=torch.int64)
    chunks: list[tuple[int, int]] = []
    s = 0
    while s < n_pre:
        fits = int((torch.cumsum(lens_t[s:], dim=0) <= workspace_rows).sum())
        e = s + max(1, fits)
        chunks.append((s, e))
        s = e
    excl = torch.cumsum(lens_t, dim=0) - lens_t
    starts_t = excl.clone()
    for s, e in chunks:
        starts_t[s:e] -= excl[s]
    return _finish(
        qsl=qsl,
        t=t,
        dql=dql,
        active=active,
        num_decodes=nd,
        num_decode_tokens=num_decode_tokens,
        ids=ids_t.tolist(),
        chunks=chunks,
        starts=starts_t.tolist(),
        prefill_lens=prefill_lens,
    )
