"""A convert batch's device tensors made together: its block table and its top-k rows with each
row's request, from the requests' numbers (numpy columns), in one host-to-device copy.

The definition is the torch builders': ``fill.block_table`` on the table plan and
``topk.request_rows`` on each request's ``topk_rows`` ints. On a GPU the fused room makes the
same bytes in one launch (``fused.convert_batch``): a realistic batch is host-bound, and two
launches, the ``topk_rows`` columns and a bigger copy were a third of its generation time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from mlafuzz.generators.rng.bits import Device
from mlafuzz.generators.rng.fill import TablePlan, block_table, upload
from mlafuzz.generators.rng.fusing import fused_room
from mlafuzz.generators.rng.pool import QUARTER, WORD_MASK, Draws, device_name, window_width, word_pool
from mlafuzz.generators.rng.topk import negatives, past_end_of, rank_table, request_rows, topk_rows
from mlafuzz.generators.spec import Layout, TopkMode

__all__ = ["Batch", "convert_batch"]


@dataclass(frozen=True)
class Batch:
    """A convert batch: rows [0, before) and [before + rows, ...) of owners, indices and local_rows
    are the step's other rows (slack)."""

    table: Tensor  # int32 [R, M], the plan's block table
    owners: Tensor  # int32 [before + rows + after]: each row's request
    indices: Tensor  # int32 [before + rows + after, K]: request-local top-k rows
    local_rows: Tensor | None  # int32, each row's request's prefill index (-1: a decode request); None without
    workspace_starts: Tensor | None  # int32 [prefill requests]: where each one's tokens start in the workspace


def convert_batch(
    draws: Draws,
    plan: TablePlan,
    *,
    seq: np.ndarray,
    tokens: np.ndarray,
    prefill: np.ndarray | None,
    before: int = 0,
    after: int = 0,
    block_size: int,
    topk: int,
    mode: TopkMode | str,
    device: Device,
) -> Batch:
    """The batch of R requests (``seq``, ``tokens``, ``prefill``: int64 [R] columns; prefill 0 or 1,
    None: no prefill workspace). The table is ``block_table(draws.child("table"), plan)`` (every
    column live); the rows ``request_rows(draws.child("topk"), ...)`` of ``before + rows + after``
    rows, request r owning rows from its first, the exclusive prefix sum of ``tokens``. With a
    workspace a prefill request's tokens fill it in request order (workspace_starts), and each row
    carries its request's index among the prefill requests (local_rows)."""
    mode = TopkMode(mode)
    if plan.live:
        raise ValueError("convert_batch: a convert table has every column live")
    num_req, rows = len(seq), int(tokens.sum())
    first = np.cumsum(tokens) - tokens  # each request's first row
    if prefill is not None:
        local = np.where(prefill == 1, np.cumsum(prefill) - 1, -1)  # its index among the prefill requests
        in_workspace = seq * prefill
        request_workspace = np.cumsum(in_workspace) - in_workspace  # a prefill request's tokens start here
        workspace = request_workspace[prefill == 1]
    else:
        local, request_workspace, workspace = np.full(num_req, -1), 0, np.zeros(0, dtype=np.int64)
    fused = fused_room(device)
    if fused is None:
        table_rows, per_request, starts, local_dev, workspace_dev = upload(
            plan.rows,
            topk_rows(seq_lens=seq, width=plan.width, block_size=block_size, topk=topk),
            first,
            local,
            workspace,
            device=device,
        )
        table = block_table(draws.child("table"), plan, rows=table_rows, device=device)
        owners, indices, local_rows = request_rows(
            draws.child("topk"),
            per_request=per_request,
            starts=starts,
            rows=rows,
            before=before,
            after=after,
            local=local_dev if prefill is not None else None,
            width=plan.width,
            block_size=block_size,
            topk=topk,
            mode=mode,
            device=device,
        )
        return Batch(
            table=table,
            owners=owners,
            indices=indices,
            local_rows=local_rows,
            # Its own storage: the bytes around it are then the same whichever path made it.
            workspace_starts=workspace_dev.clone() if prefill is not None else None,
        )
    # The fused room: one row of ints per request (the plan's four, seq_len, first row, prefill
    # index, workspace start); the kernel computes topk_rows's ints from seq_len and writes the
    # workspace starts. The torch path's checks first.
    past_end = past_end_of(width=plan.width, block_size=block_size)
    if num_req < 1:
        raise ValueError("request_rows: a batch needs at least one request")
    row_words = draws.child("topk").child("row")
    row_words.span((before + rows + after) * 4)
    window_width(topk)
    packed = np.zeros((num_req, fused.BATCH_COLUMNS), dtype=np.int64)
    packed[:, :4] = plan.rows
    packed[:, 4] = seq
    packed[:, 5] = first
    packed[:, 6] = local
    packed[:, 7] = request_workspace
    (requests,) = upload(packed, device=device)
    perm = None if plan.layout is Layout.CONTIGUOUS else draws.child("table").child("ids").perm(plan.pool)
    dev = device_name(device)
    table, owners, indices, local_rows, workspace_starts = fused.convert_batch(
        requests=requests,
        perm=perm.scalars() if perm is not None else None,
        width=plan.width,
        pool=plan.pool,
        base=plan.base_block,
        shared=plan.shared,
        table=word_pool(dev),
        row_offset=row_words.offset,
        rows=rows,
        before=before,
        after=after,
        has_local=prefill is not None,
        prefill=len(workspace),
        ranks=rank_table(topk, dev),
        negatives=negatives(block_size, topk, dev),
        k=topk,
        block_size=block_size,
        past_end=past_end,
        mode=mode.value,
        word_mask=WORD_MASK,
        quarter=QUARTER,
    )
    return Batch(table=table, owners=owners, indices=indices, local_rows=local_rows, workspace_starts=workspace_starts)
