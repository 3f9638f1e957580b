"""Where a gathered row's record is: SPEC.md section 4's addressing, which names no record format.

Request b owns dst rows [ws[b], ws[b+1]); its row ws[b] + j reads position seq_starts[b] + j,
which lives at slot block_table[b, p // bs] * bs + p % bs. Every format's gather oracle (fp8_ds_mla's
``oracles.gather``, nvfp4_ds_mla's ``formats.nvfp4_gather``, a new format's) finds its records
here and judges a call's addressing with the same precondition classes; what a record holds is the
format's (its row in ``table``, its codec). Beside the table, not in ``oracles.gather``, so that the
formats room needs nothing of fp8_ds_mla's oracle.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["PRECONDITION_CLASSES", "addressing_violations", "row_records", "violations"]

PRECONDITION_CLASSES = (
    "ws0_nonzero",
    "ws_decreasing",
    "ws_past_total",
    "block_index_past_table",
    "block_id_past_cache",
    "negative_seq_start",
    "slot_past_row_map",
    "device_row_past_cache",
    "host_row_past_cache",
)


def violations(ws: list[int], ss: list[int], table: list[list[int]], bs: int, num_blocks: int, total: int) -> list[str]:
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


def addressing_violations(
    *, ws: list[int], seq_starts: list[int], table: list[list[int]], block_size: int, num_blocks: int, total: int
) -> list[str]:
    """The violated classes of section 4's addressing (the first six of the vocabulary) for
    ws[:B], seq_starts[:B] and the table's first B rows as lists: they name no record format, so
    every format's gather (``oracles.gather``, ``oracles.formats.nvfp4_gather``) judges its calls
    with them."""
    return violations(ws, seq_starts, table, block_size, num_blocks, total)


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


def host_args(
    *,
    cache: Tensor,
    record_bytes: int,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> tuple[list[int], list[int], list[list[int]], int, int]:
    """A gather call's host-side shape checks, for any record format (``cache`` already viewed as
    ``[num_blocks, bs, record_bytes]`` bytes); (ws[:B], seq_starts[:B], table rows, bs, num_blocks)."""
    if cache.dim() != 3 or cache.shape[2] != record_bytes:
        raise ValueError(f"src_cache.shape={tuple(cache.shape)}: expected [num_blocks, bs, {record_bytes}]")
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
