"""Oracle for `gather`: FP8 gather and upconvert with seq_starts (SPEC.md section 4).

Request b (b < batch_size) owns dst rows [ws[b], ws[b+1]), the last request
[ws[B-1], total); dst[ws[b] + j] = dequant(record at position
seq_starts[b] + j of request b), position p living at slot
block_table[b, p // bs] * bs + p % bs, bs = src_cache.shape[1].

The oracle returns dst as a new bf16 tensor [total, 576] instead of writing
one in place. It only defines dst when the preconditions hold, and raises
ValueError naming the violated classes otherwise; `gather_preconditions`
lists them without raising, in this fixed vocabulary:

- "ws0_nonzero": ws[0] != 0 (rows [0, ws[0]) would be owned by nobody). Also
  used for batch_size == 0 with total > 0: every row is unowned.
- "ws_decreasing": ws[b+1] < ws[b] for some b < B-1.
- "ws_past_total": ws[B-1] > total.
- "block_index_past_table": (seq_starts[b] + len_b - 1) // bs >= M for a
  request with len_b > 0.
- "block_id_past_cache": a block id the request reads is outside
  [0, num_blocks) (negative ids included: they read before the cache).
- "negative_seq_start": seq_starts[b] < 0 for a request with len_b > 0.

Readings: only requests with rows (len_b > 0) are checked for the table and
cache classes, since an empty request reads nothing; lengths are computed
only where ws is consistent, so a decreasing ws is reported once as
"ws_decreasing" and not again through negative lengths. Malformed shapes
(ws, seq_starts or block_table shorter than batch_size, a record size other
than 656, total < 0) are argument errors, raised as ValueError by both
functions. workspace_starts may have batch_size + 1 entries: the last is
ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mlafuzz.oracles.codec import (
    RECORD_BYTES,
    ROW_DIM,
    as_record_bytes,
    dequant_records,
    dequant_records_loop,
)

__all__ = ["PRECONDITION_CLASSES", "gather_preconditions", "gather_loop", "gather", "row_records"]

PRECONDITION_CLASSES = (
    "ws0_nonzero",
    "ws_decreasing",
    "ws_past_total",
    "block_index_past_table",
    "block_id_past_cache",
    "negative_seq_start",
)


def _host_args(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> tuple[list[int], list[int], list[list[int]], int, int]:
    """Shape checks; returns (ws[:B], seq_starts[:B], table rows, bs, num_blocks)."""
    cache = as_record_bytes(src_cache)
    if cache.dim() != 3 or cache.shape[2] != RECORD_BYTES:
        raise ValueError(f"src_cache.shape={tuple(cache.shape)}: expected [num_blocks, bs, 656]")
    if batch_size < 0 or total < 0:
        raise ValueError(f"batch_size={batch_size}, total={total}: must be >= 0")
    ws = workspace_starts.reshape(-1).tolist()
    if len(ws) < batch_size:
        raise ValueError(f"workspace_starts has {len(ws)} entries < batch_size={batch_size}")
    ss = [0] * batch_size if seq_starts is None else seq_starts.reshape(-1).tolist()
    if len(ss) < batch_size:
        raise ValueError(f"seq_starts has {len(ss)} entries < batch_size={batch_size}")
    if block_table.dim() != 2 or (batch_size > 0 and block_table.shape[0] < batch_size):
        raise ValueError(f"block_table.shape={tuple(block_table.shape)}: expected [>= {batch_size}, M]")
    table = block_table[:batch_size].tolist()
    return ws[:batch_size], ss[:batch_size], table, cache.shape[1], cache.shape[0]


def _violations(
    ws: list[int], ss: list[int], table: list[list[int]], bs: int, num_blocks: int, total: int
) -> list[str]:
    found: set[str] = set()
    n = len(ws)
    if n == 0:
        return ["ws0_nonzero"] if total > 0 else []
    if ws[0] != 0:
        found.add("ws0_nonzero")
    if any(ws[b + 1] < ws[b] for b in range(n - 1)):
        found.add("ws_decreasing")
    if ws[n - 1] > total:
        found.add("ws_past_total")
    ends = ws[1:] + [total]
    m = len(table[0]) if table else 0
    for b in range(n):
        length = ends[b] - ws[b]
        if length <= 0:
            continue
        if ss[b] < 0:
            found.add("negative_seq_start")
        first, last = ss[b], ss[b] + length - 1
        if last // bs >= m:
            found.add("block_index_past_table")
        lo = max(0, first) // bs
        hi = min(last // bs, m - 1)
        if any(not 0 <= table[b][i] < num_blocks for i in range(lo, hi + 1)):
            found.add("block_id_past_cache")
    return [c for c in PRECONDITION_CLASSES if c in found]


def gather_preconditions(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> list[str]:
    """The violated precondition classes (module docstring), in vocabulary
    order; [] when the call is well defined."""
    ws, ss, table, bs, num_blocks = _host_args(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    return _violations(ws, ss, table, bs, num_blocks, total)


def _require_preconditions(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> tuple[list[int], list[int], list[list[int]], int]:
    """Like gather_preconditions, but raises ValueError naming the violated
    classes; returns (ws[:B], seq_starts[:B], table rows, bs)."""
    ws, ss, table, bs, num_blocks = _host_args(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    bad = _violations(ws, ss, table, bs, num_blocks, total)
    if bad:
        raise ValueError(
            f"gather preconditions violated: {bad} (batch_size={batch_size}, "
            f"total={total}, workspace_starts={ws}, seq_starts={ss})"
        )
    return ws, ss, table, bs


def gather_loop(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> Tensor:
    """SPEC section 4, request by request and row by row, dequantizing each
    record with `dequant_records_loop`. Returns bf16 [total, 576] on the CPU."""
    ws, ss, table, bs = _require_preconditions(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    cache = as_record_bytes(src_cache).cpu()
    rows: list[Tensor | None] = [None] * total
    for b in range(batch_size):
        end = ws[b + 1] if b + 1 < batch_size else total
        for j in range(end - ws[b]):
            p = ss[b] + j
            block = table[b][p // bs]
            record = cache[block, p % bs]
            rows[ws[b] + j] = dequant_records_loop(record.unsqueeze(0))[0]
    if any(r is None for r in rows):  # cannot happen once preconditions hold
        raise AssertionError("gather_loop left a dst row unowned")
    if total == 0:
        return torch.empty(0, ROW_DIM, dtype=torch.bfloat16)
    return torch.stack(rows)  # type: ignore[arg-type]


def gather(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> Tensor:
    """Vectorized SPEC section 4 on src_cache's device; bit-identical to
    `gather_loop`. Each dst row finds its owner with a right-sided
    searchsorted over ws[:B] (with empty requests, the last request whose
    start is <= the row is the one that owns it)."""
    _require_preconditions(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    cache = as_record_bytes(src_cache)
    dev = cache.device
    if total == 0:
        return torch.empty(0, ROW_DIM, dtype=torch.bfloat16, device=dev)
    block, entry = row_records(
        block_size=cache.shape[1],
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
        device=dev,
    )
    return dequant_records(cache[block, entry])


def row_records(
    *,
    block_size: int,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """(block id, entry in the block), int64 [total] each, of the record every dst row reads,
    vectorized: the owner of row i is found with a right-sided searchsorted over ws[:B] (with
    empty requests, the last request whose start is <= i), its position is
    seq_starts[owner] + i - ws[owner], then the block table. Assumes the preconditions hold
    (``gather`` checks them first; the fused GPU check runs on valid cases only)."""
    ws = workspace_starts.reshape(-1)[:batch_size].to(device, torch.int64)
    rows = torch.arange(total, dtype=torch.int64, device=device)
    owner = torch.searchsorted(ws, rows, right=True) - 1
    pos = rows - ws[owner]
    if seq_starts is not None:
        pos += seq_starts.reshape(-1)[:batch_size].to(device, torch.int64)[owner]
    blk_idx = torch.div(pos, block_size, rounding_mode="floor")
    block = block_table[:batch_size].to(device, torch.int64)[owner, blk_idx]
    return block, pos - blk_idx * block_size
