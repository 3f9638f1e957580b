"""Vectorized, device-exact builders of a case's tensors: block tables, top-k rows, writer inputs,
distinct slot mappings. Each is a pure function of its arguments and a ``Draws`` stream (pool.py).

They run on the case's own device with no per-row or per-request Python loop:
the per-request numbers come from the spec as host lists (one host-to-device
copy), every random choice is integer arithmetic on 31-bit words, and every
float is assembled from bit fields (bits.py) in pools made once per process
on the CPU. So CPU and CUDA give the same bytes.

Cost is what shaped them (a GPU case is host-bound at ~5-10 us per torch op,
and memory-bound for the big tensors): few ops, int32 wherever the values
allow, one pass per op over an [N, K] tensor, per-row values broadcast.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from mlafuzz.generators import catalog
from mlafuzz.generators.rng.bits import (
    BF16,
    FORMATS,
    FP16,
    Device,
    HalfFormat,
    const,
    half_bits,
    half_pattern,
    normal_bits,
    normal_fields,
    pick,
    to_half,
)
from mlafuzz.generators.rng.fusing import fused_room
from mlafuzz.generators.rng.hashing import Stream, scale_below
from mlafuzz.generators.rng.pool import POOL_WORDS, Draws, window_width, windows, word_pool
from mlafuzz.generators.spec import Layout, TopkMode, WriterValues

__all__ = [
    "upload",
    "TablePlan",
    "plan_table",
    "block_table",
    "topk_rows",
    "topk_indices",
    "writer_inputs",
    "distinct_slots",
    "RANK_ROWS",
]

INT32_MAX = catalog.INT32_MAX
INT32_MIN = catalog.INT32_MIN
_QUARTER = 1 << 29  # a 31-bit word is below this with probability 1/4
_MASK = POOL_WORDS - 1


def _dev(device: Device) -> str:
    return str(torch.device(device))


# --- host ints to the device ---------------------------------------------------


def upload(*parts: Sequence[int] | Sequence[Sequence[int]], device: Device) -> list[Tensor]:
    """Host ints (per request, from the spec) in one int32 copy to the device: each part a flat list
    or a list of equal-length rows, returned as a contiguous view of the one tensor (1-D, or
    [rows, width]). A copy from pageable host memory is a host sync: one per case, not one per
    builder."""
    flat: list[int] = []
    shapes = []
    for part in parts:
        rows = list(part)
        if rows and isinstance(rows[0], (tuple, list)):
            shapes.append((len(rows), len(rows[0])))
            for row in rows:
                flat.extend(row)
        else:
            shapes.append((len(rows),))
            flat.extend(rows)
    whole = torch.tensor(flat, dtype=torch.int32, device=device)
    out, at = [], 0
    for shape in shapes:
        n = shape[0] * (shape[1] if len(shape) == 2 else 1)
        out.append(whole[at : at + n].view(shape))
        at += n
    return out


# --- paging ------------------------------------------------------------------


@dataclass(frozen=True)
class TablePlan:
    """A block table's host side (``plan_table``): per request a row of ints for the device, and the
    table's shape. Materializers send the rows of several builders to the device in one copy."""

    rows: list[tuple[int, int, int, int]]  # per request: columns, an owned column's pool shift, live lo, hi
    pool: int  # blocks of the pool: ids base_block .. base_block + pool - 1
    width: int
    shared: int
    layout: Layout
    base_block: int
    live: bool


def plan_table(
    *,
    need: Sequence[int],
    layout: Layout | str,
    spare_blocks: int = 0,
    extra_cols: int = 0,
    base_block: int = 0,
    live: Sequence[tuple[int, int]] | None = None,
) -> TablePlan:
    """The plan of a block table int32 [R, M] (``block_table`` makes it).

    Request r holds need[r] blocks (columns); M = max(need) + extra_cols (>= 1);
    entries past a request's blocks are 0, as in vLLM's tests. shared_prefix
    gives every request the same first max(1, min(need) // 2) ids (R > 1,
    min > 0); the pool is then those, each request's own blocks, and
    spare_blocks ids no request owns; contiguous numbers them in that order,
    shuffled and shared_prefix by a random permutation of the pool.

    ``live``: per request, the inclusive column range [lo, hi] a call reads (lo > hi: none). Only
    live columns own pool blocks; a request's other columns hold random ids of the pool (blocks
    other requests own, like a prefix cache shares them), so a pool holds what a call touches
    whatever the contexts. Default: every column is live.
    """
    layout = Layout(layout)
    num_req = len(need)
    lo_need = min(need, default=0)
    shared = max(1, lo_need // 2) if layout is Layout.SHARED_PREFIX and num_req > 1 and lo_need > 0 else 0
    ranges = [(0, n - 1) for n in need] if live is None else [(lo, min(hi, n - 1)) for (lo, hi), n in zip(live, need)]
    rows, at = [], shared
    for n, (lo, hi) in zip(need, ranges):
        start = max(lo, shared)
        rows.append((n, at - start, start, hi))  # an owned column c is pool block c + (at - start)
        at += max(0, hi - start + 1)
    pool = max(at + spare_blocks, 1)
    if base_block < 0 or base_block + pool > INT32_MAX + 1:
        raise ValueError(f"base_block={base_block} + pool={pool}: block ids must fit int32")
    return TablePlan(
        rows=rows,
        pool=pool,
        width=max(max(need, default=0) + extra_cols, 1),
        shared=shared,
        layout=layout,
        base_block=base_block,
        live=live is not None,
    )


def block_table(draws: Draws, plan: TablePlan, *, rows: Tensor, device: Device) -> Tensor:
    """The table of ``plan``, int32 [R, M]; ``rows``: plan.rows on the device (int32 [R, >= 4]).
    On a GPU the fused room (generators/fused) makes the same table in one launch after the sort."""
    num_req, width, pool, shared = len(plan.rows), plan.width, plan.pool, plan.shared
    fused = fused_room(device)
    if fused is not None:
        cold = draws.child("cold") if plan.live else None
        if cold is not None:  # the torch path's bounds on the words it reads: the same errors
            cold.span(num_req)
            window_width(width)
        return fused.block_table(
            ids=None
            if plan.layout is Layout.CONTIGUOUS
            else torch.sort(draws.child("ids").words(pool, device=device), stable=True).indices,
            rows=rows,
            table=word_pool(device),
            cold_offset=cold.offset if cold is not None else None,
            width=width,
            pool=pool,
            base=plan.base_block,
            shared=shared,
            word_mask=_MASK,
        )
    if plan.layout is Layout.CONTIGUOUS:
        ids = torch.arange(plan.base_block, plan.base_block + pool, dtype=torch.int32, device=device)
    else:
        ids = torch.sort(draws.child("ids").words(pool, device=device), stable=True).indices.to(torch.int32)
        ids = ids + plan.base_block if plan.base_block else ids
    ids = torch.cat([ids, const((0,), _dev(device), torch.int32)])  # index pool: a column past the request's
    col = torch.arange(width, dtype=torch.int32, device=device)
    index = col + rows[:, 1:2]  # an owned column's pool index
    if shared:
        index = torch.where(col < shared, col, index)
    if plan.live:  # the columns a call does not read: random blocks of the pool
        offsets = draws.child("cold").words(num_req, device=device) & _MASK
        cold = windows(offsets, width, device=device) % pool
        keep = (col >= rows[:, 2:3]) & (col <= rows[:, 3:4])
        index = torch.where(keep | (col < shared) if shared else keep, index, cold)
    index = torch.where(col < rows[:, 0:1], index, pool)
    return torch.index_select(ids, 0, index.reshape(-1)).view(num_req, width)


# --- top-k indices -----------------------------------------------------------

RANK_ROWS = 256  # column permutations per K (fewer for a wide K: the table stays <= 2**20 entries)


@functools.lru_cache(maxsize=16)
def _ranks(k: int, device: str) -> Tensor:
    """int32 [Q * 2K]: Q random permutations of the K columns, each stored twice over, so any
    rotation of one is a window of K entries."""
    q = max(1, min(RANK_ROWS, POOL_WORDS // k))
    perms = Stream(0, f"mlafuzz/ranks/{k}").permutation(k, batch=(q,), device="cpu").to(torch.int32)
    return perms.repeat(1, 2).reshape(-1).to(device)


def _rank_rows(words: Tensor, k: int, device: Device) -> Tensor:
    """int32 [N, K]: row r a rotation of one of the column permutations (a random bijection of the
    columns: the first n_valid ranks mark a random n_valid-subset, scattered over the row)."""
    table = _ranks(k, _dev(device))
    span = table.shape[0]
    if span & (span - 1) == 0 and k & (k - 1) == 0:  # K and the table powers of two: a mask picks both
        starts = words & ((span - 1) & ~k)  # bit log2(K) clear: row q, rotation < K
    else:
        starts = (words % (span // (2 * k))) * (2 * k) + (words >> 8) % k
    return torch.index_select(table.unfold(0, k, 1), 0, starts)


def _negatives(bs: int, k: int, device: str) -> Tensor:
    """The negative mode's five per-row values (a row picks one by its word): int32 on device."""
    return const((-2, -bs, -k, INT32_MIN, -(2**20)), device, torch.int32)


def topk_rows(*, seq_lens: Sequence[int], width: int, block_size: int, topk: int) -> list[tuple[int, ...]]:
    """Per request, the 8 host ints ``topk_indices`` reads per row (the device gathers them by each
    row's request: one op)."""
    past_end = width * block_size
    if past_end + 2 * block_size > INT32_MAX:
        raise ValueError(f"width={width} * block_size={block_size}: table positions must fit int32")
    rows = []
    for s in seq_lens:
        cap = min(topk, s)
        m = (cap + 1) // 6
        span = past_end - s
        rows.append(
            (max(s, 1), -1 if s == 0 else 0, cap + 1 + 2 * m, m, cap, s, max(span, 1), _QUARTER if span > 0 else 0)
        )
    return rows


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
    of their class: negative (one of -2, -bs, -K, INT32_MIN, -2**20 per row),
    past_table (M*bs .. M*bs + 2*bs per row, or INT32_MAX for 1/5 of rows),
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
            ranks=_ranks(k, _dev(device)),
            negatives=_negatives(bs, k, _dev(device)),
            k=k,
            block_size=bs,
            past_end=past_end,
            mode=mode.value,
            word_mask=_MASK,
            quarter=_QUARTER,
        )
    rw = draws.child("row").grid(n, 4, device=device)
    w = windows(rw[:, 0] & _MASK, k, device=device)
    pos = w % per_row[:, 0:1]
    if mode is TopkMode.VALID:
        return pos + per_row[:, 1:2]  # seq_len 0: 0 - 1
    n_valid = torch.minimum(torch.clamp(rw[:, 1] % per_row[:, 2] - per_row[:, 3], min=0), per_row[:, 4])
    pos.masked_fill_(_rank_rows(rw[:, 2], k, device) >= n_valid.unsqueeze(1), -1)
    if mode is TopkMode.PADDED:
        return pos
    r3 = rw[:, 3:4]
    if mode in (TopkMode.NEGATIVE, TopkMode.MIXED):
        negative = torch.index_select(_negatives(bs, k, _dev(device)), 0, (r3 % 5).reshape(-1)).unsqueeze(1)
    if mode in (TopkMode.PAST_TABLE, TopkMode.MIXED):
        past_table = torch.where((r3 >> 3) % 5 == 0, INT32_MAX, past_end + (r3 >> 6) % (2 * bs + 1))
    if mode in (TopkMode.PAST_SEQ_LEN, TopkMode.MIXED):
        past_seq = per_row[:, 5:6] + (r3 >> 16) % per_row[:, 6:7]
    if mode is TopkMode.NEGATIVE:
        return torch.where(w < _QUARTER, negative, pos)
    if mode is TopkMode.PAST_TABLE:
        return torch.where(w < _QUARTER, past_table, pos)
    room = per_row[:, 7:8]  # 2**29, or 0: no room past seq_len, the column is kept
    if mode is TopkMode.PAST_SEQ_LEN:
        return torch.where(w < room, past_seq, pos)
    third = _QUARTER // 3
    out = torch.where(w < torch.clamp(room, min=2 * third), past_seq, pos)
    out = torch.where(w < 2 * third, past_table, out)
    return torch.where(w < third, negative, out)


# --- writer inputs -----------------------------------------------------------

WRITER_TILES = 4096  # pool of 128-element kv_c tiles
WRITER_ROPES = 1024  # pool of 64-element k_pe rows

_WRITER_EXTREMES = {
    BF16: (0.0, -0.0, 1e-40, -1e-40, 3.0e38, -3.0e38, 448.0, 1e-45, 65504.0, 2.0**-126),
    FP16: (0.0, -0.0, 1e-6, -1e-6, 65504.0, -65504.0, 448.0, 2.0**-24, 60000.0, 2.0**-14),  # its fp16 analogue
}
_NONFINITE = {BF16: (0x7FC0, 0x7F80, 0xFF80), FP16: (0x7E00, 0x7C00, 0xFC00)}
_ROPE_SPECIALS = {
    BF16: catalog.ROPE_SPECIAL_BITS,
    FP16: (0x7E00, 0xFE00, 0x7C01, 0xFFFF, 0x7C00, 0xFC00, 0x0001, 0x8001, 0x0000, 0x8000),
}
_WIDE_SHIFT = {BF16: (-30, 30), FP16: (-20, 12)}  # fp16: what its 2**-24..65504 range can hold


@functools.cache
def _extremes(fmt: HalfFormat) -> tuple[int, ...]:
    return tuple(half_pattern(v, fmt) for v in _WRITER_EXTREMES[fmt])


def _special(w: Tensor, table: tuple[int, ...]) -> Tensor:
    return const(table, "cpu")[pick((w >> 10) & 63, 6, len(table))]


def _writer_tiles(stream: Stream, values: WriterValues, fmt: HalfFormat) -> Tensor:
    w = stream.child("tiles").words((WRITER_TILES, 128), device="cpu")
    tile = stream.child("tile").words((WRITER_TILES, 1), device="cpu")
    sign, exp, mant = normal_fields(w, fmt)
    if values is WriterValues.WIDE:  # per-tile magnitude 2**lo .. 2**hi
        lo, hi = _WIDE_SHIFT[fmt]
        exp = exp + scale_below(tile, hi - lo + 1) + lo
    bits = half_bits(sign, exp, mant, fmt)
    hit = (w >> 24) & 0x7F
    if values is WriterValues.EXTREME:  # 1/3 of elements special, 1/6 of tiles all zero
        bits = torch.where(pick(hit, 7, 3) == 0, _special(w, _extremes(fmt)), bits)
        bits = bits.masked_fill(scale_below(tile, 6) == 0, 0)
    elif values is WriterValues.NAN:  # 3/128 ~ 1/40 of elements NaN / +inf / -inf
        bits = torch.where(hit < 3, _special(w, _NONFINITE[fmt]), bits)
    return bits


def _writer_ropes(stream: Stream, values: WriterValues, fmt: HalfFormat) -> Tensor:
    w = stream.child("ropes").words((WRITER_ROPES, 64), device="cpu")
    bits = normal_bits(w, fmt)
    if values in (WriterValues.EXTREME, WriterValues.NAN):  # 1/8 NaN-with-payload / inf / subnormal patterns
        bits = torch.where(((w >> 24) & 0x7F) < 16, _special(w, _ROPE_SPECIALS[fmt]), bits)
    return bits


@functools.lru_cache(maxsize=32)
def _writer_chunks(values: WriterValues, dtype: torch.dtype, device: str) -> Tensor:
    """The mode's 64-element chunks, [2 * WRITER_TILES + WRITER_ROPES, 64] of dtype: the kv_c tiles
    as halves, then the k_pe rows; made on the CPU once per process, copied to the device."""
    fmt = FORMATS[dtype]
    pool = Stream(0, f"mlafuzz/writer/{values.value}/{fmt.name}")  # modes and dtypes share no values
    tiles = _writer_tiles(pool, values, fmt).reshape(2 * WRITER_TILES, 64)
    return to_half(torch.cat([tiles, _writer_ropes(pool, values, fmt)]), dtype).to(device)


def writer_inputs(
    draws: Draws, *, num_tokens: int, values: WriterValues | str, dtype: torch.dtype = torch.bfloat16, device: Device
) -> Tensor:
    """The writer's projection output, [T, 576] of bf16 or fp16: kv_c = [:, :512], k_pe = [:, 512:].

    Token rows are made of pool chunks: four kv_c tiles from a pool of 4096
    and one k_pe row from a pool of 1024, so a row is one gather of 9
    64-element chunks. The pools are built element by element (normal-like
    values, and the mode's per-tile spread / specials), so every tile of the
    batch has the mode's statistics; two tokens are equal with probability
    4096**-4 / 1024. Row i depends only on (the stream, i).
    Modes: normal; wide (each pool tile scaled by 2**k, k in [-30, 30] for
    bf16, [-20, 12] for fp16 whose range is smaller); extreme; nan. fp16 gets
    fp16 analogues of the bf16 special values.
    """
    chunks = _writer_chunks(WriterValues(values), dtype, _dev(device))
    dev = _dev(device)
    fused = fused_room(device)
    if fused is not None:  # the same rows in one launch (generators/fused)
        token_words = draws.child("token")
        token_words.span(num_tokens * 5)  # the torch path's bound on the words it reads
        return fused.writer_rows(
            table=word_pool(device),
            token_offset=token_words.offset,
            chunks=chunks,
            num_tokens=num_tokens,
            tiles=WRITER_TILES,
            ropes=WRITER_ROPES,
        )
    # Token t's 9 chunks: tile k's two halves (2 * tile + 0, 1) from its word k, the rope from word 4.
    picks = draws.child("token").grid(num_tokens, 5, device=device)[:, const(_CHUNK_WORD, dev)]
    index = (picks & const(_CHUNK_MASK, dev, torch.int32)) * const(_CHUNK_MUL, dev, torch.int32)
    index += const(_CHUNK_ADD, dev, torch.int32)
    return torch.index_select(chunks, 0, index.reshape(-1)).reshape(num_tokens, 576)


_CHUNK_WORD = (0, 0, 1, 1, 2, 2, 3, 3, 4)
_CHUNK_MASK = (WRITER_TILES - 1,) * 8 + (WRITER_ROPES - 1,)
_CHUNK_MUL = (2,) * 8 + (1,)
_CHUNK_ADD = (0, 1) * 4 + (2 * WRITER_TILES,)


# --- slot mappings -----------------------------------------------------------


def distinct_slots(draws: Draws, *, n: int, num_slots: int, padding: bool = False, device: Device) -> Tensor:
    """n distinct slots in [0, num_slots), int64 [n], in random order; with padding, each is -1 w.p. 1/4.

    A sorted random sample, never a permutation of num_slots: draw v_i
    uniform in [0, num_slots - n], sort, add i (stars and bars: a
    non-decreasing sequence plus 0, 1, ... is strictly increasing, and stays
    below num_slots), then shuffle by the order of n more words. Every
    n-subset can come out; subsets are close to, not exactly, uniform. Costs
    O(n log n) whatever num_slots.
    """
    if not 0 <= n <= min(num_slots, POOL_WORDS) or num_slots - n >= INT32_MAX:
        raise ValueError(
            f"n={n}, num_slots={num_slots}: need 0 <= n <= num_slots, n <= {POOL_WORDS}, num_slots - n < 2**31 - 1"
        )
    draws_w = draws.child("draw").words(n, device=device) % (num_slots - n + 1)
    ranked = torch.sort(draws_w).values.to(torch.int64) + torch.arange(n, dtype=torch.int64, device=device)
    slots = ranked[torch.sort(draws.child("order").words(n, device=device), stable=True).indices]
    if padding:
        slots = torch.where(draws.child("pad").words(n, device=device) < _QUARTER, -1, slots)
    return slots
