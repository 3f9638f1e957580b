"""Oracle for the packing chunk planner (SPEC.md section 9.1; vLLM #50613).

``plan(context_lens, row_budget, max_context_chunk, split_alignment,
padded_rows)`` cuts the prefill requests' contexts into chunks, each gathered
into one workspace of ``row_budget`` rows. Semantics, in our words (read from
SPEC 9.1 and checked against vLLM's ``plan_mla_context_chunks`` and its tests
for facts; no code taken):

- Requests are walked in order. A request with context 0 is in no chunk; it
  also closes the chunk being built (a chunk covers a contiguous run of
  requests that all have context).
- A chunk's rows for a request slice ``[start, start + n)`` are
  ``padded_rows(start + n) - padded_rows(start)`` (the rank-local rows under
  DCP, the tokens without it). Whole remaining contexts are added while the
  chunk's rows stay <= ``row_budget``.
- The first request that does not fit is split: the chunk takes its longest
  prefix ``k * split_alignment`` (k >= 0) that is at most ``max_context_chunk``,
  leaves at least one token (at most ``round_down(remaining - 1,
  split_alignment)``) and still fits; the chunk then closes, also when k is 0
  (the request starts the next chunk, from its split point). So only a chunk's
  first request starts past 0 (``is_continuation``), every start is a multiple
  of ``split_alignment``, and ``max_context_chunk`` caps only split pieces, never
  a whole remaining context that fits.
- Valid input (``PlanSpec`` holds the draws to it; vLLM asserts where it is
  broken): ``max_context_chunk >= split_alignment >= 1`` and one aligned piece
  fits the budget (``padded_rows(s + split_alignment) - padded_rows(s) <=
  row_budget`` for every aligned s), so every chunk holds at least one request.

``plan_loop`` is the obviously-correct walk (the split by trying k from the
largest down); ``problems`` checks a plan's invariants (SPEC 9.1), whatever
planner made it. Chunks are ``Chunk`` records; the op row turns them into
tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Chunk", "padded_rows_of", "plan_loop", "problems", "INVARIANTS"]


@dataclass(frozen=True)
class Chunk:
    request_start: int
    request_end: int
    starts: tuple[int, ...]
    seq_lens: tuple[int, ...]
    is_continuation: bool


def padded_rows_of(*, dcp_world_size: int, interleave: int) -> Callable[[int], int]:
    """vLLM's call site's ``padded_rows``: the identity without DCP, else ``ceil(r / (D*I)) * I``."""
    if dcp_world_size <= 1:
        return lambda rows: rows
    virtual = dcp_world_size * interleave
    return lambda rows: -(-rows // virtual) * interleave


def plan_loop(
    *,
    context_lens: list[int],
    row_budget: int,
    max_context_chunk: int,
    split_alignment: int,
    padded_rows: Callable[[int], int],
) -> list[Chunk]:
    """The plan (module docstring), one request at a time."""
    chunks: list[Chunk] = []
    r, start, n = 0, 0, len(context_lens)
    while r < n:
        if context_lens[r] == 0:
            r += 1
            continue
        first, starts, lens, rows = r, [], [], 0
        while r < n and context_lens[r] > 0:
            remaining = context_lens[r] - start
            need = padded_rows(start + remaining) - padded_rows(start)
            if rows + need <= row_budget:
                starts.append(start)
                lens.append(remaining)
                rows += need
                r, start = r + 1, 0
                continue
            top = min(max_context_chunk, (remaining - 1) // split_alignment * split_alignment)
            k = top // split_alignment
            while k > 0 and rows + padded_rows(start + k * split_alignment) - padded_rows(start) > row_budget:
                k -= 1
            if k > 0:
                starts.append(start)
                lens.append(k * split_alignment)
                start += k * split_alignment
            break
        if not lens:
            raise ValueError(
                f"request {r} (context {context_lens[r]}, from {start}) fits no chunk: row_budget={row_budget}"
                f" holds no aligned piece of split_alignment={split_alignment}"
            )
        chunks.append(Chunk(first, first + len(lens), tuple(starts), tuple(lens), starts[0] > 0))
    return chunks


INVARIANTS = ("covered_once_in_order", "continuation_first_only", "aligned_starts", "rows_in_budget", "well_formed")


def problems(
    chunks: list[Chunk],
    *,
    context_lens: list[int],
    row_budget: int,
    split_alignment: int,
    padded_rows: Callable[[int], int],
) -> dict[str, str | None]:
    """SPEC 9.1's invariants of any plan: invariant -> why it breaks (None: it holds).

    - well_formed: each chunk's request range is non-empty, inside the batch, its starts and
      seq_lens one per request, seq_lens > 0, is_continuation == (starts[0] > 0);
    - covered_once_in_order: each request's [0, ctx) is covered exactly once, in order, by the
      chunks in order; a request with context 0 is in no chunk;
    - continuation_first_only: only a chunk's first request starts past 0;
    - aligned_starts: every start is a multiple of split_alignment;
    - rows_in_budget: a chunk's padded rows are <= row_budget (so its cu_seq_lens[-1], the sum
      of its seq_lens, is the number of context tokens it gathers).
    """
    out: dict[str, str | None] = dict.fromkeys(INVARIANTS)
    cursor = [0] * len(context_lens)
    for i, c in enumerate(chunks):
        n = c.request_end - c.request_start
        if (
            not (0 <= c.request_start < c.request_end <= len(context_lens))
            or len(c.starts) != n
            or len(c.seq_lens) != n
        ):
            out["well_formed"] = out["well_formed"] or (
                f"chunk {i}: requests [{c.request_start}, {c.request_end}) with {len(c.starts)} starts and"
                f" {len(c.seq_lens)} seq_lens, for a batch of {len(context_lens)}"
            )
            continue
        if any(x <= 0 for x in c.seq_lens) or c.is_continuation != (c.starts[0] > 0):
            out["well_formed"] = out["well_formed"] or (
                f"chunk {i}: seq_lens={list(c.seq_lens)}, is_continuation={c.is_continuation} with"
                f" starts[0]={c.starts[0]}"
            )
        if any(s > 0 for s in c.starts[1:]):
            out["continuation_first_only"] = out["continuation_first_only"] or (
                f"chunk {i}: starts={list(c.starts)}: a request after the first starts mid-context"
            )
        if any(s % split_alignment for s in c.starts):
            out["aligned_starts"] = out["aligned_starts"] or (
                f"chunk {i}: starts={list(c.starts)} not multiples of split_alignment={split_alignment}"
            )
        rows = sum(padded_rows(s + n_) - padded_rows(s) for s, n_ in zip(c.starts, c.seq_lens))
        if rows > row_budget:
            out["rows_in_budget"] = out["rows_in_budget"] or (
                f"chunk {i}: {rows} rows (seq_lens={list(c.seq_lens)}) > row_budget={row_budget}"
            )
        for j, (s, n_) in enumerate(zip(c.starts, c.seq_lens)):
            r = c.request_start + j
            if s != cursor[r] and out["covered_once_in_order"] is None:
                out["covered_once_in_order"] = (
                    f"chunk {i}: request {r} starts at {s}, but its context is covered up to {cursor[r]}"
                )
            cursor[r] = max(cursor[r], s + n_)
    if out["covered_once_in_order"] is None:
        short = [(r, c, n) for r, (c, n) in enumerate(zip(cursor, context_lens)) if c != n]
        if short:
            r, c, n = short[0]
            out["covered_once_in_order"] = f"request {r}: context covered up to {c} of {n}"
    return out
