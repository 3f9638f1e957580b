"""Request-local top-k rows (SPEC 5.3): the per-request ints a row needs (host), the rows themselves,
and each row's request, built the way fill.py builds the rest of a case: vectorized, device-exact
integer arithmetic on the word table (pool.py), in one launch of the fused room on a GPU."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from mlafuzz.generators import catalog
from mlafuzz.generators.rng.bits import Device, const
from mlafuzz.generators.rng.fusing import fused_room
from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.pool import (
    POOL_WORDS,
    QUARTER,
    WORD_MASK,
    Draws,
    device_name,
    window_width,
    windows,
    word_pool,
)
from mlafuzz.generators.spec import TopkMode

__all__ = ["RANK_ROWS", "rank_table", "negatives", "past_end_of", "topk_rows", "topk_indices", "request_rows"]


RANK_ROWS = 256  # column permutations per K (fewer for a wide K: the table stays <= 2**20 entries)


@functools.lru_cache(maxsize=16)
def rank_table(k: int, device: str) -> Tensor:
    """int32 [Q * 2K]: Q random permutations of the K columns, each stored twice over, so any
    rotation of one is a window of K entries."""
    q = max(1, min(RANK_ROWS, POOL_WORDS // k))
    perms = Stream(0, f"mlafuzz/ranks/{k}").permutation(k, batch=(q,), device="cpu").to(torch.int32)
    return perms.repeat(1, 2).reshape(-1).to(device)


def _rank_rows(words: Tensor, k: int, device: Device) -> Tensor:
    """int32 [N, K]: row r a rotation of one of the column permutations (a random bijection of the
    columns: the first n_valid ranks mark a random n_valid-subset, scattered over the row)."""
    table = rank_table(k, device_name(device))
    span = table.shape[0]
    if span & (span - 1) == 0 and k & (k - 1) == 0:  # K and the table powers of two: a mask picks both
        starts = words & ((span - 1) & ~k)  # bit log2(K) clear: row q, rotation < K
    else:
        starts = (words % (span // (2 * k))) * (2 * k) + (words >> 8) % k
    return torch.index_select(table.unfold(0, k, 1), 0, starts)


def negatives(bs: int, k: int, device: str) -> Tensor:
    """The negative mode's five per-row values (a row picks one by its word): int32 on device."""
    return const((-2, -bs, -k, catalog.INT32_MIN, -(2**20)), device, torch.int32)


def past_end_of(*, width: int, block_size: int) -> int:
    """The first position past a table of ``width`` columns, checked: the rows' positions past it
    (up to 2 * block_size more) must fit int32."""
    past_end = width * block_size
    if past_end + 2 * block_size > catalog.INT32_MAX:
        raise ValueError(f"width={width} * block_size={block_size}: table positions must fit int32")
    return past_end


def topk_rows(*, seq_lens: Sequence[int] | np.ndarray, width: int, block_size: int, topk: int) -> np.ndarray:
    """Per request, the 8 host ints ``topk_indices`` reads per row, int64 [R, 8] (numpy: a few vector
    ops for any batch; the device gathers them by each row's request)."""
    past_end = past_end_of(width=width, block_size=block_size)
    s = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    cap = np.minimum(s, topk)
    m = (cap + 1) // 6
    span = past_end - s
    return np.stack(
        [
            np.maximum(s, 1),
            np.where(s == 0, -1, 0),
            cap + 1 + 2 * m,
            m,
            cap,
            s,
            np.maximum(span, 1),
            np.where(span > 0, QUARTER, 0),
        ],
        axis=1,
    )


def topk_indices(
    draws: Draws, *, per_row: Tensor, width: int, block_size: int, topk: int, mode: TopkMode | str, device: Device
) -> Tensor:
    """Request-local top-k rows, int32 [N, K]; ``per_row`` (int32 [N, 8] on the device) holds, for
    each row, its request's ``topk_rows``.

    Column c of row r reads the word w of its window (pool.py); its position is
    w % seq_len. valid: those positions (all -1 when seq_len == 0). padded:
    n_valid of them, the rest -1, with n_valid = clamp(w' % (cap + 1 + 2m) - m,
    0, cap) for cap = min(K, seq_len) and m = (cap + 1) // 6: uniform in
    between, and about 1/8 of rows all -1 and 1/8 full, so the edges are not
    left to chance; the valid columns scattered (a random permutation of the
    columns ranks them). The other modes start from the padded row and
    replace each column with probability 1/4 (w < 2**29) by its row's value
    of their class: negative (one of -2, -bs, -K, catalog.INT32_MIN, -2**20 per row),
    past_table (M*bs .. M*bs + 2*bs per row, or catalog.INT32_MAX for 1/5 of rows),
    past_seq_len (seq_len .. M*bs - 1 per row; the column kept when M*bs <=
    seq_len); mixed draws the class per column (1/12 each). Positions are NOT
    distinct within a row (the indexer's are): two columns may hold the same
    position. About a dozen device ops whatever the size.
    """
    mode = TopkMode(mode)
    n, k, bs = per_row.shape[0], topk, block_size
    past_end = width * bs
    fused = fused_room(device)
    if fused is not None:  # the same rows in one launch (generators/fused)
        row_words = draws.child("row")
        row_words.span(n * 4)  # the torch path's bounds on the words it reads: the same errors
        window_width(k)
        return fused.topk_indices(
            table=word_pool(device),
            row_offset=row_words.offset,
            per_row=per_row,
            ranks=rank_table(k, device_name(device)),
            negatives=negatives(bs, k, device_name(device)),
            k=k,
            block_size=bs,
            past_end=past_end,
            mode=mode.value,
            word_mask=WORD_MASK,
            quarter=QUARTER,
        )
    rw = draws.child("row").grid(n, 4, device=device)
    w = windows(rw[:, 0] & WORD_MASK, k, device=device)
    pos = w % per_row[:, 0:1]
    if mode is TopkMode.VALID:
        return pos + per_row[:, 1:2]  # seq_len 0: 0 - 1
    n_valid = torch.minimum(torch.clamp(rw[:, 1] % per_row[:, 2] - per_row[:, 3], min=0), per_row[:, 4])
    pos.masked_fill_(_rank_rows(rw[:, 2], k, device) >= n_valid.unsqueeze(1), -1)
    if mode is TopkMode.PADDED:
        return pos
    r3 = rw[:, 3:4]
    if mode in (TopkMode.NEGATIVE, TopkMode.MIXED):
        negative = torch.index_select(negatives(bs, k, device_name(device)), 0, (r3 % 5).reshape(-1)).unsqueeze(1)
    if mode in (TopkMode.PAST_TABLE, TopkMode.MIXED):
        past_table = torch.where((r3 >> 3) % 5 == 0, catalog.INT32_MAX, past_end + (r3 >> 6) % (2 * bs + 1))
    if mode in (TopkMode.PAST_SEQ_LEN, TopkMode.MIXED):
        past_seq = per_row[:, 5:6] + (r3 >> 16) % per_row[:, 6:7]
    if mode is TopkMode.NEGATIVE:
        return torch.where(w < QUARTER, negative, pos)
    if mode is TopkMode.PAST_TABLE:
        return torch.where(w < QUARTER, past_table, pos)
    room = per_row[:, 7:8]  # 2**29, or 0: no room past seq_len, the column is kept
    if mode is TopkMode.PAST_SEQ_LEN:
        return torch.where(w < room, past_seq, pos)
    third = QUARTER // 3
    out = torch.where(w < torch.clamp(room, min=2 * third), past_seq, pos)
    out = torch.where(w < 2 * third, past_table, out)
    return torch.where(w < third, negative, out)


def request_rows(
    draws: Draws,
    *,
    per_request: Tensor,
    starts: Tensor,
    rows: int,
    before: int = 0,
    after: int = 0,
    local: Tensor | None = None,
    width: int,
    block_size: int,
    topk: int,
    mode: TopkMode | str,
    device: Device,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """A batch's top-k rows with each row's request: (owners, indices, local rows).

    ``per_request``: each request's ``topk_rows`` on the device (int32 [R, 8]); ``starts``: the
    requests' first rows, the exclusive prefix sums of their row counts (int32 [R], R >= 1).
    The batch is ``before + rows + after`` rows: row before + j (j < rows) belongs to the last
    request whose start is <= j (an empty request owns no row); a slack row i (the whole step's
    other rows, SPEC 5.4) to request i % R before the batch and (i - rows) % R after it.
    owners is int32 [before + rows + after]; indices ``topk_indices`` of those rows; with
    ``local`` (int32 [R]), local[owner] per row, else None. A convert batch's rows are made with
    its table (batch.py), on a GPU in one launch of the fused room.
    """
    mode = TopkMode(mode)
    num_req = starts.shape[0]
    if num_req < 1:
        raise ValueError("request_rows: a batch needs at least one request")
    batch = torch.arange(rows, dtype=torch.int32, device=device)
    owners = torch.searchsorted(starts, batch, right=True, out_int32=True) - 1
    if before or after:
        slack = torch.arange(before + after, dtype=torch.int32, device=device) % num_req
        owners = torch.cat([slack[:before], owners, slack[before:]])
    indices = topk_indices(
        draws,
        per_row=torch.index_select(per_request, 0, owners),
        width=width,
        block_size=block_size,
        topk=topk,
        mode=mode,
        device=device,
    )
    return owners, indices, None if local is None else torch.index_select(local, 0, owners)
