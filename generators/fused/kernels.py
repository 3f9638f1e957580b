"""Fused generation kernels (Triton): each big tensor of a case in one launch.

Each kernel computes, element by element, exactly what its torch builder in generators/rng
computes with a dozen ops: the same words of the same word table, the same integer arithmetic
(``%``, ``&``, ``>>`` and compares on non-negative int32 values, where every device and C's
truncating division agree with torch's floor division; a keyed permutation's mixing on uint32
words, whose wrapping multiply is the torch builder's int64 product masked to 32 bits), the
same table lookups. No float is
computed: floats are copied as the bit patterns of their pools. So the bytes are the torch
builders', which tests/generators/test_fused.py checks under the CPU interpreter and on the GPU.

The callers (generators/rng) pass every table and constant, so this module needs nothing of
mlafuzz and the room can be deleted. The per-case numbers (offsets, sizes) are runtime scalars
that are not specialized on: a run compiles each kernel once per mode flag, not per case. A
realistic case is host-bound, so the kernels are launched through ``_Launch`` (the compiled
kernel's own launcher, half the host time of ``kernel[grid]``), and a convert batch's block
table and top-k rows are one launch (``convert_batch``), not two.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

__all__ = [
    "INTERPRETED",
    "TOPK_MODES",
    "block_table",
    "distinct_slots",
    "topk_indices",
    "BATCH_COLUMNS",
    "convert_batch",
    "fill_records",
    "writer_rows",
]

# The top-k modes (generators.spec.TopkMode values); a mode's index is the kernels' ``mode``.
TOPK_MODES = ("valid", "padded", "negative", "past_table", "past_seq_len", "mixed")
_TILE = 1024  # columns per program of a row-wise kernel
# The block table's columns per program, and slots per program: a permutation's walk steps until
# the slowest value of a program is in range, so a program holds few values (one or two a thread).
_TABLE_TILE = 128
_RECORDS_PER_PROGRAM = 16
_TOKENS_PER_PROGRAM = 32
_SLOTS_PER_PROGRAM = 256

_I32 = 1 << 31


class _Launch:
    """A kernel of this room, launched cheaply on the host: ``_Launch(kernel)(grid, tensors, ints,
    **constexprs)``, the kernel's parameters being its tensors, then its ints, then its constexprs
    (in that order).

    Triton's own launch, ``kernel[grid](...)``, binds and specializes every argument each time:
    about 25 us for this room's 40-argument kernels on an H200's host, as much as the rest of a
    case's generation. The first launch of a variant goes through it (it compiles the kernel or
    finds it); later ones call the compiled kernel it returned, which takes the same arguments,
    in about half the time.

    The variant is everything Triton specializes these kernels on: the device, the constexprs,
    each tensor's dtype and, where the kernel lets Triton assume alignment, whether its address
    is a multiple of 16, and each int's width. Every int parameter of this room's kernels is in
    do_not_specialize (checked at the first launch), so Triton keys an int by i32 or i64 only; a
    launch with an int outside int32 is Triton's own every time. Under the interpreter every
    launch is Triton's. ``_compiled`` only remembers what Triton's own cache would answer, as
    functools.cache does: deleting it loses speed, never changes a launch.
    """

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        self._compiled: dict[tuple, Any] = {}
        self._aligned: tuple[int, ...] | None = None  # tensors Triton may specialize on alignment

    def _check(self, tensors: int, ints: int, constexprs: list[str]) -> tuple[int, ...]:
        params = self._fn.params
        runtime = [p for p in params if not p.is_constexpr]
        if len(runtime) != tensors + ints or [p.name for p in params if p.is_constexpr] != constexprs:
            raise TypeError(f"{self._fn.__name__}: launched with arguments in another order than its parameters")
        loose = [p.name for p in runtime[tensors:] if not p.do_not_specialize]
        if loose:
            raise TypeError(f"{self._fn.__name__}: int parameters {loose} must be in do_not_specialize")
        return tuple(i for i, p in enumerate(runtime[:tensors]) if not p.do_not_specialize_on_alignment)

    def __call__(self, grid: tuple[int, ...], tensors: tuple, ints: tuple, **constexprs: Any) -> None:
        fn = self._fn
        if INTERPRETED or not all(-_I32 <= v < _I32 for v in ints):
            fn[grid](*tensors, *ints, **constexprs)
            return
        if self._aligned is None:
            self._aligned = self._check(len(tensors), len(ints), list(constexprs))
        key = (
            torch.cuda.current_device(),
            *constexprs.values(),
            *(t.dtype for t in tensors),
            *(tensors[i].data_ptr() % 16 == 0 for i in self._aligned),
        )
        compiled = self._compiled.get(key)
        if compiled is not None:
            compiled[(*grid, 1, 1)[:3]](*tensors, *ints, *constexprs.values())
            return
        compiled = fn[grid](*tensors, *ints, **constexprs)
        if hasattr(compiled, "result"):  # compiled asynchronously: keep the outcome
            compiled = compiled.result()
        if hasattr(compiled, "packed_metadata"):  # a CompiledKernel: its own launcher takes the arguments
            self._compiled[key] = compiled


_PERM_SCALARS = ["p_n", "p_c", "p_lo", "p_hi", "p_k0", "p_k1", "p_k2", "p_k3", "p_k4", "p_k5", "p_k6", "p_k7"]


@triton.jit
def _perm_f(v, k):
    """rng.shuffle's F on uint32 words: its int64 products masked to 32 bits are these wrapping
    multiplies."""
    y = v ^ k.to(tl.uint32)
    y = y ^ (y >> 16)
    y = y * tl.full((), 0x7FEB352D, tl.uint32)
    y = y ^ (y >> 15)
    y = y * tl.full((), 0x046CA68B, tl.uint32)
    return y ^ (y >> 16)


@triton.jit
def _perm_network(x, p_c, p_lo, p_hi, p_k0, p_k1, p_k2, p_k3, p_k4, p_k5, p_k6, p_k7):
    c = p_c.to(tl.uint32)
    lo_mask = p_lo.to(tl.uint32)
    hi_mask = p_hi.to(tl.uint32)
    hi = x >> c
    lo = x & lo_mask
    hi = hi ^ (_perm_f(lo, p_k0) & hi_mask)
    lo = lo ^ (_perm_f(hi, p_k1) & lo_mask)
    hi = hi ^ (_perm_f(lo, p_k2) & hi_mask)
    lo = lo ^ (_perm_f(hi, p_k3) & lo_mask)
    hi = hi ^ (_perm_f(lo, p_k4) & hi_mask)
    lo = lo ^ (_perm_f(hi, p_k5) & lo_mask)
    hi = hi ^ (_perm_f(lo, p_k6) & hi_mask)
    lo = lo ^ (_perm_f(hi, p_k7) & lo_mask)
    return (hi << c) | lo


@triton.jit
def _permute(i, p_n, p_c, p_lo, p_hi, p_k0, p_k1, p_k2, p_k3, p_k4, p_k5, p_k6, p_k7):
    """rng.shuffle.permute at the values i (each in [0, p_n)), as int64: the network's eight
    rounds on uint32 words, then cycle walking until every value is back in range."""
    y = _perm_network(i.to(tl.uint32), p_c, p_lo, p_hi, p_k0, p_k1, p_k2, p_k3, p_k4, p_k5, p_k6, p_k7)
    n = p_n.to(tl.uint32)
    todo = y >= n
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        y = tl.where(todo, _perm_network(y, p_c, p_lo, p_hi, p_k0, p_k1, p_k2, p_k3, p_k4, p_k5, p_k6, p_k7), y)
        todo = y >= n
    return y.to(tl.int64)


_TABLE_SCALARS = ["rows_s0", "cold_offset", "width", "pool", "base", "shared", "word_mask", *_PERM_SCALARS]
# _FLAGS: a kernel's flags (the pool permuted or not, cold columns, padding slots, the top-k mode,
# prefill rows, activations' scales) are runtime ints, not constexprs: as constexprs every
# combination a worker met was a compile of its own (~0.45 s each on an H100; 5 of the batch kernel
# per worker of a cold run), for branches uniform over a launch. Each kernel is one variant.


@triton.jit
def _table_tile(
    out_ptr,
    row,
    table_ptr,
    r,
    col,
    cold_offset,
    width,
    pool,
    base,
    shared,
    word_mask,
    p_n,
    p_c,
    p_lo,
    p_hi,
    p_k0,
    p_k1,
    p_k2,
    p_k3,
    p_k4,
    p_k5,
    p_k6,
    p_k7,
    shuffled,
    live,
):
    """Columns ``col`` of table row r; ``row`` points at the request's plan ints (need, shift, live
    lo, hi). ``shuffled`` (the pool permuted) and ``live`` (random cold columns) are runtime
    flags or constants: one compiled kernel serves every table (see _FLAGS)."""
    cm = col < width
    need = tl.load(row)
    shift = tl.load(row + 1)
    index = col + shift  # an owned column's pool index
    index = tl.where(col < shared, col, index)
    if live != 0:  # the columns a call does not read: random blocks of the pool
        off = tl.load(table_ptr + cold_offset + r) & word_mask
        cold = tl.load(table_ptr + off + col, mask=cm, other=0) % pool
        keep = ((col >= tl.load(row + 2)) & (col <= tl.load(row + 3))) | (col < shared)
        index = tl.where(keep, index, cold)
    index = tl.where(col < need, index, pool)
    inside = index < pool
    if shuffled != 0:
        ids = _permute(
            tl.where(inside & cm, index, 0), p_n, p_c, p_lo, p_hi, p_k0, p_k1, p_k2, p_k3, p_k4, p_k5, p_k6, p_k7
        )
    else:
        ids = index.to(tl.int64)
    tl.store(out_ptr + r.to(tl.int64) * width + col, tl.where(inside, ids + base, 0).to(tl.int32), mask=cm)


@triton.jit(do_not_specialize=[*_TABLE_SCALARS, "shuffled", "live"], do_not_specialize_on_alignment=["rows_ptr"])
def _table_kernel(
    out_ptr,
    rows_ptr,
    table_ptr,
    rows_s0,
    cold_offset,
    width,
    pool,
    base,
    shared,
    word_mask,
    p_n,
    p_c,
    p_lo,
    p_hi,
    p_k0,
    p_k1,
    p_k2,
    p_k3,
    p_k4,
    p_k5,
    p_k6,
    p_k7,
    shuffled,
    live,
    TILE: tl.constexpr,
):
    r = tl.program_id(0)
    _table_tile(
        out_ptr,
        rows_ptr + r.to(tl.int64) * rows_s0,
        table_ptr,
        r,
        tl.program_id(1) * TILE + tl.arange(0, TILE),
        cold_offset,
        width,
        pool,
        base,
        shared,
        word_mask,
        p_n,
        p_c,
        p_lo,
        p_hi,
        p_k0,
        p_k1,
        p_k2,
        p_k3,
        p_k4,
        p_k5,
        p_k6,
        p_k7,
        shuffled,
        live,
    )


def _perm_args(perm: tuple[int, ...] | None) -> tuple[int, ...]:
    return perm if perm is not None else (1, 0, 0, 1) + (0,) * 8


def block_table(
    *,
    perm: tuple[int, ...] | None,
    rows: torch.Tensor,
    table: torch.Tensor,
    cold_offset: int | None,
    width: int,
    pool: int,
    base: int,
    shared: int,
    word_mask: int,
) -> torch.Tensor:
    """int32 [R, width]: rng.fill.block_table's table. ``perm``: the pool's permutation
    (``PermKey.scalars()``; None: the contiguous layout, pool index i is block base + i);
    ``rows``: the plan's rows on the device ([R, >= 4] int32); ``cold_offset``: the offset of the
    cold columns' words (None: every column live)."""
    num_req = rows.shape[0]
    out = torch.empty((num_req, width), dtype=torch.int32, device=rows.device)
    if num_req == 0 or width == 0:
        return out
    live = cold_offset is not None
    _TABLE(
        (num_req, triton.cdiv(width, _TABLE_TILE)),
        (out, rows, table),
        (rows.stride(0), cold_offset if live else 0, width, pool, base, shared, word_mask, *_perm_args(perm))
        + (int(perm is not None), int(live)),
        TILE=_TABLE_TILE,
    )
    return out


@triton.jit(do_not_specialize=["n", "offset", "pad_offset", "quarter", *_PERM_SCALARS, "padding"])
def _slots_kernel(
    out_ptr,
    table_ptr,
    n,
    offset,
    pad_offset,
    quarter,
    p_n,
    p_c,
    p_lo,
    p_hi,
    p_k0,
    p_k1,
    p_k2,
    p_k3,
    p_k4,
    p_k5,
    p_k6,
    p_k7,
    padding,
    RB: tl.constexpr,
):
    i = tl.program_id(0) * RB + tl.arange(0, RB)
    m = i < n
    slot = _permute(tl.where(m, i, 0), p_n, p_c, p_lo, p_hi, p_k0, p_k1, p_k2, p_k3, p_k4, p_k5, p_k6, p_k7) + offset
    if padding != 0:  # a runtime flag (see _FLAGS)
        slot = tl.where(tl.load(table_ptr + pad_offset + i, mask=m, other=quarter) < quarter, -1, slot)
    tl.store(out_ptr + i, slot, mask=m)


def distinct_slots(
    *, perm: tuple[int, ...], n: int, offset: int, table: torch.Tensor, pad_offset: int | None, quarter: int
) -> torch.Tensor:
    """int64 [n]: rng.fill.distinct_slots's slots, offset + the permutation ``perm`` at 0..n-1;
    with ``pad_offset``, -1 where the word at pad_offset + i of ``table`` is below ``quarter``."""
    out = torch.empty(n, dtype=torch.int64, device=table.device)
    if n == 0:
        return out
    _SLOTS(
        (triton.cdiv(n, _SLOTS_PER_PROGRAM),),
        (out, table),
        (n, offset, pad_offset if pad_offset is not None else 0, quarter, *perm, int(pad_offset is not None)),
        RB=_SLOTS_PER_PROGRAM,
    )
    return out


_TOPK_SCALARS = ["row_offset", "k", "span", "ranks_pow2", "bs", "past_end", "word_mask", "quarter", "third"]


@triton.jit
def _topk_tile(
    out_ptr,
    table_ptr,
    ranks_ptr,
    negatives_ptr,
    r,
    c,
    pr,
    row_offset,
    k,
    span,
    ranks_pow2,
    bs,
    past_end,
    word_mask,
    quarter,
    third,
    mode,
    DERIVE: tl.constexpr,
):
    """Columns ``c`` of top-k row r, from its four words at row_offset + 4r of the table and its
    request's ints at ``pr``: rng.topk.topk_rows's eight, or with DERIVE the request's seq_len alone,
    the eight computed from it here as topk_rows computes them. ``mode``: the top-k mode's index
    in TOPK_MODES, a runtime value (see _FLAGS)."""
    cm = c < k
    words = table_ptr + row_offset + r * 4  # the row's four words
    rw0 = tl.load(words)
    if DERIVE:
        s = tl.load(pr)
        cap = tl.minimum(s, k)
        m = (cap + 1) // 6
        span_s = past_end - s
        i0 = tl.maximum(s, 1)
        i1 = tl.where(s == 0, -1, 0)
        i2 = cap + 1 + 2 * m
        i3 = m
        i4 = cap
        i5 = s
        i6 = tl.maximum(span_s, 1)
        i7 = tl.where(span_s > 0, quarter, 0)
    else:
        i0 = tl.load(pr)
        i1 = tl.load(pr + 1)
        i2 = tl.load(pr + 2)
        i3 = tl.load(pr + 3)
        i4 = tl.load(pr + 4)
        i5 = tl.load(pr + 5)
        i6 = tl.load(pr + 6)
        i7 = tl.load(pr + 7)
    w = tl.load(table_ptr + (rw0 & word_mask) + c, mask=cm, other=0)
    pos = w % i0
    if mode == 0:  # valid (the modes by their index in TOPK_MODES)
        out = pos + i1
    else:
        n_valid = tl.minimum(tl.maximum(tl.load(words + 1) % i2 - i3, 0), i4)
        rw2 = tl.load(words + 2)
        start = tl.where(ranks_pow2 != 0, rw2 & ((span - 1) & ~k), (rw2 % (span // (2 * k))) * (2 * k) + (rw2 >> 8) % k)
        rank = tl.load(ranks_ptr + start + c, mask=cm, other=0)
        out = tl.where(rank >= n_valid, -1, pos)
        if mode != 1:  # the modes past padded replace columns by their row's value of a class
            r3 = tl.load(words + 3)
            negative = tl.load(negatives_ptr + r3 % 5)
            past_table = tl.where((r3 >> 3) % 5 == 0, 2147483647, past_end + (r3 >> 6) % (2 * bs + 1))
            room = i7  # 2**29, or 0: no room past seq_len
            past_seq = i5 + (r3 >> 16) % i6
            if mode == 2:
                out = tl.where(w < quarter, negative, out)
            elif mode == 3:
                out = tl.where(w < quarter, past_table, out)
            elif mode == 4:
                out = tl.where(w < room, past_seq, out)
            else:
                out = tl.where(w < tl.maximum(room, 2 * third), past_seq, out)
                out = tl.where(w < 2 * third, past_table, out)
                out = tl.where(w < third, negative, out)
    tl.store(out_ptr + r.to(tl.int64) * k + c, out, mask=cm)


@triton.jit(
    do_not_specialize=["per_row_s0", *_TOPK_SCALARS, "mode"],
    do_not_specialize_on_alignment=["per_row_ptr", "negatives_ptr", "ranks_ptr"],
)
def _topk_kernel(
    out_ptr,
    table_ptr,
    ranks_ptr,
    per_row_ptr,
    negatives_ptr,
    per_row_s0,
    row_offset,
    k,
    span,
    ranks_pow2,
    bs,
    past_end,
    word_mask,
    quarter,
    third,
    mode,
    TILE: tl.constexpr,
):
    r = tl.program_id(0)
    _topk_tile(
        out_ptr,
        table_ptr,
        ranks_ptr,
        negatives_ptr,
        r,
        tl.program_id(1) * TILE + tl.arange(0, TILE),
        per_row_ptr + r.to(tl.int64) * per_row_s0,  # its request's eight ints
        row_offset,
        k,
        span,
        ranks_pow2,
        bs,
        past_end,
        word_mask,
        quarter,
        third,
        mode,
        False,
    )


def _ranks_args(ranks: torch.Tensor, k: int) -> tuple[int, int]:
    span = ranks.shape[0]
    return span, int(span & (span - 1) == 0 and k & (k - 1) == 0)


def topk_indices(
    *,
    table: torch.Tensor,
    row_offset: int,
    per_row: torch.Tensor,
    ranks: torch.Tensor,
    negatives: torch.Tensor,
    k: int,
    block_size: int,
    past_end: int,
    mode: str,
    word_mask: int,
    quarter: int,
) -> torch.Tensor:
    """int32 [N, k]: rng.topk.topk_indices's rows, row r from its request's eight ints (row r of
    ``per_row``, int32 [N, 8]) and its four words at ``row_offset + 4r`` of ``table``."""
    n = per_row.shape[0]
    out = torch.empty((n, k), dtype=torch.int32, device=per_row.device)
    if n and k:
        _TOPK(
            (n, triton.cdiv(k, _TILE)),
            (out, table, ranks, per_row, negatives),
            (per_row.stride(0), row_offset, k, *_ranks_args(ranks, k), block_size, past_end, word_mask, quarter)
            + (quarter // 3, TOPK_MODES.index(mode)),
            TILE=_TILE,
        )
    return out


# A convert batch's request row (``convert_batch``): the table plan's four ints, then seq_len, the
# request's first row, its prefill index (-1: none) and where its tokens start in the workspace.
BATCH_COLUMNS = 8
_SEQ, _START, _LOCAL, _WORKSPACE = (tl.constexpr(c) for c in (4, 5, 6, 7))  # globals a kernel may read


@triton.jit(
    do_not_specialize=[
        "req_s0",
        "width",
        "pool",
        "base",
        "shared",
        *_PERM_SCALARS,
        *_TOPK_SCALARS,
        "num_req",
        "top",
        "before",
        "rows",
        "table_programs",
        "table_tiles",
        "k_tiles",
        "shuffled",
        "mode",
        "has_local",
    ],
    do_not_specialize_on_alignment=["req_ptr", "negatives_ptr", "ranks_ptr"],
)
def _batch_kernel(
    table_out_ptr,
    out_ptr,
    owners_ptr,
    local_out_ptr,
    workspace_out_ptr,
    table_ptr,
    ranks_ptr,
    negatives_ptr,
    req_ptr,
    req_s0,
    width,
    pool,
    base,
    shared,
    p_n,
    p_c,
    p_lo,
    p_hi,
    p_k0,
    p_k1,
    p_k2,
    p_k3,
    p_k4,
    p_k5,
    p_k6,
    p_k7,
    row_offset,
    k,
    span,
    ranks_pow2,
    bs,
    past_end,
    word_mask,
    quarter,
    third,
    num_req,
    top,
    before,
    rows,
    table_programs,
    table_tiles,
    k_tiles,
    shuffled,
    mode,
    has_local,
    TABLE_TILE: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < table_programs:  # a tile of the block table
        r = pid // table_tiles
        row = req_ptr + r.to(tl.int64) * req_s0
        if has_local != 0:  # a prefill request's first table program writes its workspace start
            local = tl.load(row + _LOCAL)
            if (pid % table_tiles == 0) & (local >= 0):
                tl.store(workspace_out_ptr + local, tl.load(row + _WORKSPACE))
        _table_tile(
            table_out_ptr,
            row,
            table_ptr,
            r,
            (pid % table_tiles) * TABLE_TILE + tl.arange(0, TABLE_TILE),
            0,
            width,
            pool,
            base,
            shared,
            word_mask,
            p_n,
            p_c,
            p_lo,
            p_hi,
            p_k0,
            p_k1,
            p_k2,
            p_k3,
            p_k4,
            p_k5,
            p_k6,
            p_k7,
            shuffled,
            False,
        )
    else:  # a tile of a top-k row: first its request (rng.topk.request_rows), the last whose start <= j
        q = pid - table_programs
        r = q // k_tiles
        tile = q % k_tiles
        j = r - before
        owner = r * 0  # an int32 scalar, as the loop keeps it
        step = top  # the largest power of two <= num_req, halved down to 1
        while step > 0:
            cand = owner + step
            start = tl.load(req_ptr + tl.minimum(cand, num_req - 1) * req_s0 + _START)
            owner = tl.where((cand < num_req) & (start <= j), cand, owner)
            step = step // 2
        if (j < 0) | (j >= rows):  # a slack row of the step
            owner = tl.where(j < 0, r, r - rows) % num_req
        pr = req_ptr + owner.to(tl.int64) * req_s0
        if tile == 0:
            tl.store(owners_ptr + r, owner)
            if has_local != 0:
                tl.store(local_out_ptr + r, tl.load(pr + _LOCAL))
        _topk_tile(
            out_ptr,
            table_ptr,
            ranks_ptr,
            negatives_ptr,
            r,
            tile * TILE + tl.arange(0, TILE),
            pr + _SEQ,
            row_offset,
            k,
            span,
            ranks_pow2,
            bs,
            past_end,
            word_mask,
            quarter,
            third,
            mode,
            True,
        )


def convert_batch(
    *,
    requests: torch.Tensor,
    perm: tuple[int, ...] | None,
    width: int,
    pool: int,
    base: int,
    shared: int,
    table: torch.Tensor,
    row_offset: int,
    rows: int,
    before: int,
    after: int,
    has_local: bool,
    prefill: int,
    ranks: torch.Tensor,
    negatives: torch.Tensor,
    k: int,
    block_size: int,
    past_end: int,
    mode: str,
    word_mask: int,
    quarter: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A convert batch in one launch: (block table, owners, top-k rows, local rows, workspace
    starts), what rng.fill.block_table (every column live) and rng.topk.request_rows make.
    ``requests``: int32 [R, BATCH_COLUMNS] on the device, a request's plan row, seq_len, first row,
    prefill index and workspace start (its topk_rows ints are computed from seq_len in the
    kernel). Programs [0, R * tiles) make the table, the rest the rows; a row's program finds its
    request by a binary search over the requests' first rows. With ``has_local``, ``prefill`` is
    the number of prefill requests (the workspace starts' length)."""
    num_req, dev = requests.shape[0], requests.device
    n = before + rows + after
    table_out = torch.empty((num_req, width), dtype=torch.int32, device=dev)
    out = torch.empty((n, k), dtype=torch.int32, device=dev)
    owners = torch.empty(n, dtype=torch.int32, device=dev)
    local_out = torch.empty(n, dtype=torch.int32, device=dev) if has_local else None
    workspace = torch.empty(prefill, dtype=torch.int32, device=dev) if has_local else None
    table_tiles = triton.cdiv(width, _TABLE_TILE)
    table_programs = num_req * table_tiles if width else 0
    k_tiles = triton.cdiv(k, _TILE)
    programs = table_programs + (n * k_tiles if k else 0)
    if num_req and programs:
        _BATCH(
            (programs,),
            (table_out, out, owners, local_out if local_out is not None else out)
            + (workspace if workspace is not None else out, table, ranks, negatives, requests),
            (requests.stride(0), width, pool, base, shared, *_perm_args(perm), row_offset, k)
            + (*_ranks_args(ranks, k), block_size, past_end, word_mask, quarter, quarter // 3)
            + (num_req, 1 << (num_req.bit_length() - 1), before, rows, table_programs, table_tiles, k_tiles)
            + (int(perm is not None), TOPK_MODES.index(mode), int(has_local)),
            TABLE_TILE=_TABLE_TILE,
            TILE=_TILE,
        )
    return table_out, owners, out, local_out, workspace


@triton.jit(do_not_specialize=["first", "n", "block_offset", "bs", "word_mask", "scale_mask", "activations"])
def _records_kernel(
    out_ptr,
    table_ptr,
    pool_ptr,
    scales_ptr,
    first,
    n,
    block_offset,
    bs,
    word_mask,
    scale_mask,
    activations,
    RB: tl.constexpr,
):
    out32 = out_ptr.to(tl.pointer_type(tl.int32))  # the bytes as int32 words: no view op on the host
    pool32 = pool_ptr.to(tl.pointer_type(tl.int32))
    s = tl.program_id(0) * RB + tl.arange(0, RB)  # records
    sm = s < n
    at = tl.load(table_ptr + block_offset + s // bs, mask=sm, other=0) & word_mask  # its block's window
    j = 2 * (s % bs)
    w0 = tl.load(table_ptr + at + j, mask=sm, other=0)
    w1 = tl.load(table_ptr + at + j + 1, mask=sm, other=0)
    sel = w0 >> 21  # the codes' pool row
    if activations != 0:  # one of its 64 scale rows (a runtime flag: see _FLAGS)
        row = sel * 64 + (w1 & 63)
    else:
        row = w1 & scale_mask
    c = tl.arange(0, 256)[None, :]  # int32 words of a 656-byte record: 128 codes, 4 scales, 32 rope
    inside = sm[:, None] & (c < 164)
    is_scale = (c >= 128) & (c < 132)
    src = tl.where(c < 128, sel[:, None], (w0 & 1023)[:, None])  # the rope's pool row
    value = tl.load(pool32 + src * 164 + c, mask=inside & ~is_scale, other=0)
    scale = tl.load(scales_ptr + row[:, None] * 4 + (c - 128), mask=inside & is_scale, other=0)
    at = (first + s[:, None].to(tl.int64)) * 164 + c
    tl.store(out32 + at, tl.where(is_scale, scale, value), mask=inside)


def fill_records(
    cache: torch.Tensor,
    *,
    first: int,
    n: int,
    table: torch.Tensor,
    block_offset: int,
    block_size: int,
    pool: torch.Tensor,
    scales: torch.Tensor,
    activations: bool,
    word_mask: int,
    scale_mask: int,
) -> None:
    """rng.records.fill_records for a ``paged_cache``'s tail: records [first, first + n) of
    ``cache`` (uint8, contiguous, 4-byte aligned, 656 bytes a record), its record first + s from
    block s // block_size, the blocks' words at ``block_offset`` of ``table``; ``pool`` uint8
    [P, 656], ``scales`` int32 [rows, 4]."""
    if n == 0:
        return
    _RECORDS(
        (triton.cdiv(n, _RECORDS_PER_PROGRAM),),
        (cache, table, pool, scales),
        (first, n, block_offset, block_size, word_mask, scale_mask, int(activations)),
        RB=_RECORDS_PER_PROGRAM,
    )


@triton.jit(do_not_specialize=["num_tokens", "token_offset", "tile_mask", "rope_mask", "rope_row"])
def _writer_kernel(
    out_ptr,
    table_ptr,
    chunks_ptr,
    num_tokens,
    token_offset,
    tile_mask,
    rope_mask,
    rope_row,
    RB: tl.constexpr,
    ROW_WORDS: tl.constexpr,
):
    out32 = out_ptr.to(tl.pointer_type(tl.int32))  # halves as int32 pairs: no view op on the host
    chunks32 = chunks_ptr.to(tl.pointer_type(tl.int32))
    t = tl.program_id(0) * RB + tl.arange(0, RB)
    part = tl.program_id(1)  # chunks 0..7: the kv_c tiles' halves; 8: the rope
    tm = t < num_tokens
    is_tile = part < 8
    word = tl.load(table_ptr + token_offset + t * 5 + tl.where(is_tile, part >> 1, 4), mask=tm, other=0)
    chunk = tl.where(is_tile, (word & tile_mask) * 2 + (part & 1), (word & rope_mask) + rope_row)
    c = tl.arange(0, 32)[None, :]  # 32 int32 words: the chunk's 64 halves
    value = tl.load(chunks32 + chunk[:, None] * 32 + c, mask=tm[:, None], other=0)
    tl.store(out32 + t[:, None].to(tl.int64) * ROW_WORDS + part * 32 + c, value, mask=tm[:, None])


def writer_rows(
    *,
    table: torch.Tensor,
    token_offset: int,
    chunks: torch.Tensor,
    num_tokens: int,
    tiles: int,
    ropes: int,
    width: int,
) -> torch.Tensor:
    """rng.fill.writer_inputs's rows, [T, width] of chunks' dtype (width: the caller's format's
    row, this room imports nothing of mlafuzz): token t's five words at ``token_offset + 5t``,
    chunks [2 * tiles + ropes, 64] (tiles and ropes powers of two)."""
    out = torch.empty((num_tokens, width), dtype=chunks.dtype, device=chunks.device)
    if num_tokens == 0:
        return out
    _WRITER(
        (triton.cdiv(num_tokens, _TOKENS_PER_PROGRAM), 9),
        (out, table, chunks),
        (num_tokens, token_offset, tiles - 1, ropes - 1, 2 * tiles),
        RB=_TOKENS_PER_PROGRAM,
        ROW_WORDS=width // 2,  # a row's halves as int32 pairs
    )
    return out


# TRITON_INTERPRET=1 at decoration time gives interpreted kernels (CPU tensors only).
INTERPRETED = type(_topk_kernel).__name__ == "InterpretedFunction"

_TABLE, _SLOTS, _TOPK, _BATCH, _RECORDS, _WRITER = (
    _Launch(fn) for fn in (_table_kernel, _slots_kernel, _topk_kernel, _batch_kernel, _records_kernel, _writer_kernel)
)
