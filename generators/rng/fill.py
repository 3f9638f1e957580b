"""Vectorized, device-exact builders of a case's tensors: block tables, writer inputs, distinct slot
mappings (top-k rows: topk.py). Each is a pure function of its arguments and a ``Draws`` stream (pool.py).

They run on the case's own device with no per-row or per-request Python loop:
the per-request numbers come from the spec as numpy columns (one asynchronous
host-to-device copy), every random choice is integer arithmetic on 31-bit words
(random orders: keyed permutations, shuffle.py, never a sort), and every
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

import numpy as np
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
from mlafuzz.generators.rng.shuffle import permute
from mlafuzz.generators.spec import Layout
from mlafuzz.oracles.formats import table as formats

__all__ = [
    "upload",
    "TablePlan",
    "plan_table",
    "block_table",
    "writer_inputs",
    "distinct_slots",
]


# --- host ints to the device ---------------------------------------------------


def upload(*parts: Sequence[int] | Sequence[Sequence[int]] | np.ndarray, device: Device) -> list[Tensor]:
    """Host ints (per request, from the spec) in one int32 copy to the device: each part a flat
    sequence or array, or rows of equal length (a 2-D array), returned as a contiguous view of
    the one tensor (1-D, or [rows, width]). Values outside int32 are a ValueError.

    To a GPU the copy leaves from pinned memory, asynchronously: a copy from pageable memory
    would wait for everything queued before it (the last case's kernels), once per case. Torch's
    caching host allocator hands out the pinned block and reuses it only after the copy that
    read it has run. (Reused pinned buffers of our own, guarded by events, measured no faster on
    the H200: about 50 us for 1,000 ints either way.)"""
    try:
        arrays = [np.asarray(part, dtype=np.int64) for part in parts]
    except OverflowError:
        raise ValueError("upload: a value does not fit int64, let alone int32") from None
    if len(arrays) == 1:
        flat = arrays[0].reshape(-1)
    else:
        flat = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, dtype=np.int64)
    if flat.size and (flat.min() < catalog.INT32_MIN or flat.max() > catalog.INT32_MAX):
        bad = flat[(flat < catalog.INT32_MIN) | (flat > catalog.INT32_MAX)][0]
        raise ValueError(f"upload: {bad} does not fit int32")
    host = torch.from_numpy(flat.astype(np.int32))
    target = torch.device(device)
    if target.type == "cuda":
        whole = host.pin_memory().to(target, non_blocking=True)
    else:
        whole = host.to(target)
    if len(arrays) == 1:  # no split: one op less per case
        return [whole if arrays[0].ndim == 1 else whole.view(arrays[0].shape)]
    pieces = torch.split(whole, [a.size for a in arrays])
    return [p if a.ndim == 1 else p.view(a.shape) for p, a in zip(pieces, arrays)]


# --- paging ------------------------------------------------------------------


@dataclass(frozen=True)
class TablePlan:
    """A block table's host side (``plan_table``): per request a row of ints for the device, and the
    table's shape (numpy on the host: a realistic batch's hundreds of requests in a few vector ops,
    not a Python loop each). Materializers send the rows of several builders to the device in one copy."""

    rows: np.ndarray  # int64 [R, 4], per request: columns, an owned column's pool shift, live lo, hi
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
    shuffled and shared_prefix by a keyed random permutation of the pool (shuffle.py).

    ``live``: per request, the inclusive column range [lo, hi] a call reads (lo > hi: none). Only
    live columns own pool blocks; a request's other columns hold random ids of the pool (blocks
    other requests own, like a prefix cache shares them), so a pool holds what a call touches
    whatever the contexts. Default: every column is live.
    """
    layout = Layout(layout)
    need_a = np.asarray(need, dtype=np.int64).reshape(-1)
    num_req = need_a.size
    lo_need = int(need_a.min()) if num_req else 0
    shared = max(1, lo_need // 2) if layout is Layout.SHARED_PREFIX and num_req > 1 and lo_need > 0 else 0
    if live is None:
        lo, hi = np.zeros_like(need_a), need_a - 1
    else:
        ranges = np.asarray(live, dtype=np.int64).reshape(-1, 2)
        lo, hi = ranges[:, 0], np.minimum(ranges[:, 1], need_a - 1)
    start = np.maximum(lo, shared)
    owned = np.maximum(hi - start + 1, 0)  # the pool blocks a request owns: its live columns past the prefix
    at = shared + np.cumsum(owned) - owned  # where they start in the pool
    rows = np.stack([need_a, at - start, start, hi], axis=1)  # an owned column c is pool block c + (at - start)
    pool = max(shared + int(owned.sum()) + spare_blocks, 1)
    if base_block < 0 or base_block + pool > catalog.INT32_MAX + 1:
        raise ValueError(f"base_block={base_block} + pool={pool}: block ids must fit int32")
    return TablePlan(
        rows=rows,
        pool=pool,
        width=max((int(need_a.max()) if num_req else 0) + extra_cols, 1),
        shared=shared,
        layout=layout,
        base_block=base_block,
        live=live is not None,
    )


def block_table(draws: Draws, plan: TablePlan, *, rows: Tensor, device: Device) -> Tensor:
    """The table of ``plan``, int32 [R, M]; ``rows``: plan.rows on the device (int32 [R, >= 4]).
    Pool index i is block base_block + i (contiguous) or base_block + the stream's keyed
    permutation of i (shuffle.py; shuffled and shared_prefix). On a GPU the fused room
    (generators/fused) makes the same table in one launch."""
    num_req, width, pool, shared = len(plan.rows), plan.width, plan.pool, plan.shared
    perm = None if plan.layout is Layout.CONTIGUOUS else draws.child("ids").perm(pool)
    fused = fused_room(device)
    if fused is not None:
        cold = draws.child("cold") if plan.live else None
        if cold is not None:  # the torch path's bounds on the words it reads: the same errors
            cold.span(num_req)
            window_width(width)
        return fused.block_table(
            perm=perm.scalars() if perm is not None else None,
            rows=rows,
            table=word_pool(device),
            cold_offset=cold.offset if cold is not None else None,
            width=width,
            pool=pool,
            base=plan.base_block,
            shared=shared,
            word_mask=WORD_MASK,
        )
    ids = torch.arange(pool, dtype=torch.int64, device=device)
    if perm is not None:
        ids = permute(ids, perm)
    ids = (ids + plan.base_block).to(torch.int32)
    ids = torch.cat([ids, const((0,), device_name(device), torch.int32)])  # index pool: a column past the request's
    col = torch.arange(width, dtype=torch.int32, device=device)
    index = col + rows[:, 1:2]  # an owned column's pool index
    if shared:
        index = torch.where(col < shared, col, index)
    if plan.live:  # the columns a call does not read: random blocks of the pool
        offsets = draws.child("cold").words(num_req, device=device) & WORD_MASK
        cold = windows(offsets, width, device=device) % pool
        keep = (col >= rows[:, 2:3]) & (col <= rows[:, 3:4])
        index = torch.where(keep | (col < shared) if shared else keep, index, cold)
    index = torch.where(col < rows[:, 0:1], index, pool)
    return torch.index_select(ids, 0, index.reshape(-1)).view(num_req, width)


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


# The writer's value modes (generators/ops/writer.py's WriterValues, by value; it checks the two
# agree): normal, then wide per-tile spreads, extreme values, NaN and inf mixed in.
WRITER_MODES: tuple[str, ...] = ("normal", "wide", "extreme", "nan")


def _writer_tiles(stream: Stream, values: str, fmt: HalfFormat) -> Tensor:
    w = stream.child("tiles").words((WRITER_TILES, 128), device="cpu")
    tile = stream.child("tile").words((WRITER_TILES, 1), device="cpu")
    sign, exp, mant = normal_fields(w, fmt)
    if values == "wide":  # per-tile magnitude 2**lo .. 2**hi
        lo, hi = _WIDE_SHIFT[fmt]
        exp = exp + scale_below(tile, hi - lo + 1) + lo
    bits = half_bits(sign, exp, mant, fmt)
    hit = (w >> 24) & 0x7F
    if values == "extreme":  # 1/3 of elements special, 1/6 of tiles all zero
        bits = torch.where(pick(hit, 7, 3) == 0, _special(w, _extremes(fmt)), bits)
        bits = bits.masked_fill(scale_below(tile, 6) == 0, 0)
    elif values == "nan":  # 3/128 ~ 1/40 of elements NaN / +inf / -inf
        bits = torch.where(hit < 3, _special(w, _NONFINITE[fmt]), bits)
    return bits


def _writer_ropes(stream: Stream, values: str, fmt: HalfFormat) -> Tensor:
    w = stream.child("ropes").words((WRITER_ROPES, 64), device="cpu")
    bits = normal_bits(w, fmt)
    if values in ("extreme", "nan"):  # 1/8 NaN-with-payload / inf / subnormal patterns
        bits = torch.where(((w >> 24) & 0x7F) < 16, _special(w, _ROPE_SPECIALS[fmt]), bits)
    return bits


@functools.lru_cache(maxsize=32)
def _writer_chunks(values: str, dtype: torch.dtype, device: str) -> Tensor:
    """The mode's 64-element chunks, [2 * WRITER_TILES + WRITER_ROPES, 64] of dtype: the kv_c tiles
    as halves, then the k_pe rows; made on the CPU once per process, copied to the device."""
    fmt = FORMATS[dtype]
    pool = Stream(0, f"mlafuzz/writer/{values}/{fmt.name}")  # modes and dtypes share no values
    tiles = _writer_tiles(pool, values, fmt).reshape(2 * WRITER_TILES, 64)
    return to_half(torch.cat([tiles, _writer_ropes(pool, values, fmt)]), dtype).to(device)


def writer_inputs(
    draws: Draws, *, num_tokens: int, values: str, dtype: torch.dtype = torch.bfloat16, device: Device
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
    mode = str(getattr(values, "value", values))  # the writer spec's WriterValues, or its value
    if mode not in WRITER_MODES:
        raise ValueError(f"writer_inputs: values={values!r} is not one of {', '.join(WRITER_MODES)}")
    chunks = _writer_chunks(mode, dtype, device_name(device))
    dev = device_name(device)
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
            width=_ROW_DIM,
        )
    # Token t's 9 chunks: tile k's two halves (2 * tile + 0, 1) from its word k, the rope from word 4.
    picks = draws.child("token").grid(num_tokens, 5, device=device)[:, const(_CHUNK_WORD, dev)]
    index = (picks & const(_CHUNK_MASK, dev, torch.int32)) * const(_CHUNK_MUL, dev, torch.int32)
    index += const(_CHUNK_ADD, dev, torch.int32)
    return torch.index_select(chunks, 0, index.reshape(-1)).reshape(num_tokens, _ROW_DIM)


_ROW_DIM = formats.get("fp8_ds_mla").row_dim  # kv_c then k_pe: the writer's format's dequantized row
_CHUNK_WORD = (0, 0, 1, 1, 2, 2, 3, 3, 4)
_CHUNK_MASK = (WRITER_TILES - 1,) * 8 + (WRITER_ROPES - 1,)
_CHUNK_MUL = (2,) * 8 + (1,)
_CHUNK_ADD = (0, 1) * 4 + (2 * WRITER_TILES,)


# --- slot mappings -----------------------------------------------------------


def distinct_slots(
    draws: Draws, *, n: int, num_slots: int, padding: bool = False, offset: int = 0, device: Device
) -> Tensor:
    """n distinct slots in [offset, offset + num_slots), int64 [n], in random order; with padding,
    each is -1 w.p. 1/4.

    Slot i is offset + the stream's keyed permutation of [0, num_slots) at i
    (shuffle.py): distinct because a permutation is a bijection, every
    n-subset and order possible, and O(n) with no sort whatever num_slots. On
    a GPU the fused room makes them in one launch.
    """
    if not 0 <= n <= min(num_slots, POOL_WORDS) or num_slots > catalog.INT32_MAX or offset < 0:
        raise ValueError(
            f"n={n}, num_slots={num_slots}, offset={offset}: need 0 <= n <= num_slots, n <= {POOL_WORDS},"
            " num_slots < 2**31, offset >= 0"
        )
    perm = draws.child("order").perm(max(num_slots, 1))
    pad = draws.child("pad") if padding else None
    if pad is not None:
        pad.span(n)
    fused = fused_room(device)
    if fused is not None:
        return fused.distinct_slots(
            perm=perm.scalars(),
            n=n,
            offset=offset,
            table=word_pool(device),
            pad_offset=pad.offset if pad is not None else None,
            quarter=QUARTER,
        )
    slots = permute(torch.arange(n, dtype=torch.int64, device=device), perm) + offset
    if pad is not None:
        slots = torch.where(pad.words(n, device=device) < QUARTER, -1, slots)
    return slots
