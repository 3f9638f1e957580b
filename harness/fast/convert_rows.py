"""A fused fast path for checking convert: recompute each row's slots and valid count, compare, one pass.

Like harness/fast/gather.py, a filter: ``convert_rows_flag`` says "the
oracle's" only when ``out`` (and ``valid_counts``, when given) are exactly
what SPEC section 3 (as oracles.convert reads it) gives; anything else sends
the harness to the oracle and comparator. Integer arithmetic only: int64,
wrapped to int32 like the oracle.

SPEC section 7's options: a block stride (``block_stride_rows``) is one more
runtime multiplier. A compacted row (compact-to-front) is a multiset: the full
path's comparator takes the oracle's valid count n of the row, then compares
the first n values as a multiset and wants -1 in every later column. Here the
same row passes when its tail is exactly -1, valid_counts is exact, and two
sums over its first n values of a bijective 32-bit mix (two keys) equal the
sums over the oracle's valid values. Equal multisets always pass; one changed
value always moves both sums (the mix is a bijection, the sums do not wrap);
several changed values pass only if they cancel in both sums by chance (about
2**-64), the one way this filter can miss what the comparator would see.

``convert_prefill`` writes the prefill of caller-owned outputs (SPEC 9.2) with the same
kernel; the fast path's use of both is harness/fast/convert.py's.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from mlafuzz.harness.fast.launch import Launchers

_KEYS = (0x2545F491, 0x6C8E9CF5)  # the two mixes' keys: any two distinct 32-bit values
# A row's columns per loop step: two tiles, so a short row is not mostly masked lanes, and no
# variant per K (a fuzz run draws many: each was a compile, ~0.25 s, in every worker).
_SMALL_TILE = 128
_TILE = 1024


@triton.jit
def _mix(v, key):
    """A bijection of the 32 bits of int32 ``v``, as int64 in [0, 2**32) (lowbias32 with a key, in
    int64 so no product wraps): summed over a row, a multiset's signature."""
    x = (v.to(tl.int64) & 0xFFFFFFFF) ^ key
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x046CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


# One compile serves every case of a run (as in the kernel under test, kernels/triton_convert.py):
# the per-case scalars and flags are runtime values, not specialized on, and the pointers read a
# scalar per row (or gathered) are not specialized on alignment; the column strides and the rows
# of token_indices and out are (their == 1 and alignment vectorize the loads). K, the compaction,
# the prefill mode and DCP are runtime values too (as constexprs, with a tile per K, a run met a
# dozen variants per worker, and new ones long after its start); the tile is one of two.
@triton.jit(
    do_not_specialize=[
        "num_reqs",
        "max_blocks",
        "num_starts",
        "table_s0",
        "block_size",
        "block_stride",
        "has_prefill",
        "has_counts",
        "has_second",
        "same",
        "num_idx",
        "has_idx",
        "dcp_size",
        "dcp_rank",
        "interleave",
        "rank_stride",
        "k",
        "compact",
        "prefill",
        "dcp",
    ],
    do_not_specialize_on_alignment=[
        "req_ptr",
        "table_ptr",
        "counts_ptr",
        "counts2_ptr",
        "pw_ptr",
        "ps_ptr",
        "bad_ptr",
        "idx_ptr",
    ],
)
def _check_convert(
    req_ptr,
    table_ptr,
    ti_ptr,
    out_ptr,
    counts_ptr,
    out2_ptr,  # a re-run's outputs, checked in the same pass (has_second; else out's again)
    counts2_ptr,
    pw_ptr,
    ps_ptr,
    bad_ptr,
    idx_ptr,  # SPEC 10's idx_mapping (has_idx; else req's pointer, never read)
    num_reqs,
    max_blocks,
    num_starts,
    table_s0,
    table_s1,
    ti_s0,
    ti_s1,
    out_s0,
    out2_s0,
    block_size,
    block_stride,
    has_prefill,  # 0 / 1: prefill rows exist only with a prefill workspace
    has_counts,  # 0 / 1: valid_counts is checked too
    has_second,  # 0 / 1: a re-run's out (and valid_counts) are checked too
    same,  # 0 / 1: a compacted row of the re-run must be the first run's bit for bit (a caller's buffer)
    num_idx,  # SPEC 10: len(idx_mapping)
    has_idx,  # 0 / 1: rows read the table through idx_mapping
    dcp_size,  # SPEC 10: the plain convert's DCP arguments (1, 0, 1, 0: none)
    dcp_rank,
    interleave,
    rank_stride,
    k,  # K: the row's columns, a loop bound (any K: a last tile is masked)
    compact,  # 0 / 1: the rows are compacted (a multiset and -1 after it)
    prefill,  # 0 / 1: write the prefill instead of checking (``convert_prefill``)
    dcp,  # 0 / 1: dcp_size > 1, de-interleave each token (else no int64 division for it)
    TILE: tl.constexpr,
    KEY1: tl.constexpr,
    KEY2: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    req = tl.load(req_ptr + row).to(tl.int64)
    # idx_mapping: the table row is max(idx_mapping[req], 0); a req outside it reads no row (-1).
    idx_ok = (req >= 0) & (req < num_idx) & (has_idx != 0)
    mapped = tl.maximum(tl.load(idx_ptr + tl.where(idx_ok, req, 0), mask=idx_ok, other=-1).to(tl.int64), 0)
    req = tl.where(has_idx != 0, tl.where(idx_ok, mapped, -1), req)
    row_ok = (req >= 0) & (req < num_reqs)
    pw = tl.load(pw_ptr + row, mask=has_prefill != 0, other=-1).to(tl.int64)
    is_pf = pw >= 0
    pf_ok = pw < num_starts
    start = tl.load(ps_ptr + tl.where(is_pf & pf_ok, pw, 0), mask=is_pf & pf_ok, other=0).to(tl.int64)
    row_ok = tl.where(is_pf, pf_ok, row_ok)
    cols = tl.arange(0, TILE)
    bad = 0
    valid_n = 0
    sig1 = row * 0  # compacted rows: the oracle's valid values' signatures (int64 sums)
    sig2 = row * 0
    # The re-run's lanes (all or none); `!= False`: a bool mask under the interpreter (see below)
    two = ((cols >= 0) & (has_second != 0)) != False  # noqa: E712
    lo = row * 0 - 1  # prefill: the least and the greatest of -1 and the row's expected values
    hi = row * 0 - 1
    for c0 in tl.range(0, k, TILE):
        c = c0 + cols
        inside = c < k  # K need not be a multiple of the tile (vLLM 0.31.0 pads such a row to one)
        tok = tl.load(ti_ptr + row * ti_s0 + c * ti_s1, mask=inside, other=-1).to(tl.int64)
        nonneg = tok >= 0
        t0 = tl.where(nonneg, tok, 0)
        owner = t0 * 0  # DCP: the owner and the index in its share (rank 0 and t0 itself with D = 1)
        local = t0
        if dcp != 0:
            group = t0 // interleave
            owner = group % dcp_size
            local = (group // dcp_size) * interleave + t0 % interleave
        blk = local // block_size
        off = local - blk * block_size
        # another rank's decode token is invalid; a prefill token of any rank is valid
        valid = nonneg & (blk < max_blocks) & row_ok & ((owner == dcp_rank) | is_pf)
        # `!= False`: a bool mask under the CPU interpreter, where the scalars row_ok and is_pf  # noqa: E712 (a bool mask: see above)
        # broadcast into integer arrays, which Triton >= 3.7's interpreter rejects as a mask;
        # compiled, the i1 compare folds away.
        base = tl.load(
            table_ptr + tl.where(row_ok & ~is_pf, req, 0) * table_s0 + blk * table_s1,
            mask=(valid & ~is_pf) != False,
            other=0,
        ).to(tl.int64)  # noqa: E712 (a bool mask: see above)
        value = tl.where(is_pf, owner * rank_stride + start + local, base * block_stride + off)
        expected = tl.where(valid, value.to(tl.int32), -1)
        if prefill != 0:
            lo = tl.minimum(lo, tl.min(expected.to(tl.int64), axis=0))
            hi = tl.maximum(hi, tl.max(expected.to(tl.int64), axis=0))
        elif compact != 0:
            sig1 += tl.sum(tl.where(valid, _mix(expected, KEY1), 0), axis=0)
            sig2 += tl.sum(tl.where(valid, _mix(expected, KEY2), 0), axis=0)
        else:
            actual = tl.load(out_ptr + row * out_s0 + c, mask=inside, other=-1)
            actual2 = tl.load(out2_ptr + row * out2_s0 + c, mask=two & inside, other=-1)
            bad += tl.sum((expected != actual).to(tl.int32), axis=0)
            bad += tl.sum((two & (expected != actual2)).to(tl.int32), axis=0)
        valid_n += tl.sum(valid.to(tl.int32), axis=0)
    if prefill != 0:
        # One value for the whole row that is neither -1 nor any of its expected values: below the
        # least of them when that fits in int32, else above the greatest. Neither fits only when
        # the row expects both int32 extremes: then "cannot tell" (2) instead of a weaker prefill.
        fill = tl.where(lo > -2147483648, lo - 1, hi + 1).to(tl.int32)
        for c0 in tl.range(0, k, TILE):
            tl.store(out_ptr + row * out_s0 + c0 + cols, tl.zeros([TILE], dtype=tl.int32) + fill, mask=c0 + cols < k)
        # -1 - n: not the count, nor what adding the count into it leaves (the zeroing forgotten)
        tl.store(counts_ptr + row, -1 - valid_n, mask=has_counts != 0)
        tl.store(bad_ptr, 2, mask=(lo == -2147483648) & (hi == 2147483647))
    else:
        if compact != 0:  # the row's first valid_n values against the signatures, -1 after them
            sig1b = sig1  # the re-run's row against the same signatures
            sig2b = sig2
            for c0 in tl.range(0, k, TILE):
                c = c0 + cols
                actual = tl.load(out_ptr + row * out_s0 + c, mask=c < k, other=-1)
                actual2 = tl.load(out2_ptr + row * out2_s0 + c, mask=two & (c < k), other=-1)
                front = c < valid_n
                sig1 -= tl.sum(tl.where(front, _mix(actual, KEY1), 0), axis=0)
                sig2 -= tl.sum(tl.where(front, _mix(actual, KEY2), 0), axis=0)
                sig1b -= tl.sum(tl.where(front, _mix(actual2, KEY1), 0), axis=0)
                sig2b -= tl.sum(tl.where(front, _mix(actual2, KEY2), 0), axis=0)
                bad += tl.sum((~front & (actual != -1)).to(tl.int32), axis=0)
                bad += tl.sum((~front & (actual2 != -1)).to(tl.int32), axis=0)
                bad += tl.sum((two & (same != 0) & (actual != actual2)).to(tl.int32), axis=0)
            bad += ((sig1 != 0) | (sig2 != 0)).to(tl.int32)
            bad += ((has_second != 0) & ((sig1b != 0) | (sig2b != 0))).to(tl.int32)
        counted = tl.load(counts_ptr + row, mask=has_counts != 0, other=0)
        bad += ((has_counts != 0) & (counted != valid_n)).to(tl.int32)
        counted2 = tl.load(counts2_ptr + row, mask=(has_counts != 0) & (has_second != 0), other=0)
        bad += ((has_counts != 0) & (has_second != 0) & (counted2 != valid_n)).to(tl.int32)
        tl.store(bad_ptr, 1, mask=bad != 0)  # a flag, no array to reduce afterwards


def _launch(
    *,
    inputs: Mapping[str, Any],
    out: torch.Tensor,
    valid_counts: torch.Tensor | None,
    bad: torch.Tensor,
    launchers: Launchers | None,
    block_stride_rows: int | None,
    compact: bool,
    prefill: bool,
    second: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    same: bool = False,
) -> None:
    """One launch of ``_check_convert`` over out's rows (n > 0 and k > 0, a layout it reads);
    ``inputs``: the call's, as ``convert_rows_flag`` takes them; ``second``, ``same``: as there."""
    req_id, block_table, token_indices = inputs["req_id"], inputs["block_table"], inputs["token_indices"]
    block_size, has_prefill_workspace = inputs["block_size"], inputs["has_prefill_workspace"]
    prefill_workspace_request_ids = inputs["prefill_workspace_request_ids"]
    prefill_workspace_starts = inputs["prefill_workspace_starts"]
    n, k = token_indices.shape
    tile = _SMALL_TILE if k <= _SMALL_TILE else _TILE
    pw = prefill_workspace_request_ids if has_prefill_workspace else req_id
    ps = prefill_workspace_starts if has_prefill_workspace and prefill_workspace_starts.numel() else req_id
    num_starts = prefill_workspace_starts.numel() if has_prefill_workspace else 0
    counts = valid_counts if valid_counts is not None else out
    out2, counts2 = second if second is not None else (out, counts)
    idx = inputs.get("idx_mapping")
    args = (
        req_id.contiguous(),
        block_table,
        token_indices,
        out,
        counts,
        out2,
        counts2 if counts2 is not None else counts,
        pw.contiguous(),
        ps.contiguous(),
        bad,
        idx.contiguous() if idx is not None else req_id,
        block_table.shape[0],
        block_table.shape[1],
        num_starts,
        block_table.stride(0),
        block_table.stride(1),
        token_indices.stride(0),
        token_indices.stride(1),
        out.stride(0),
        out2.stride(0),
        block_size,
        block_size if block_stride_rows is None else block_stride_rows,
        int(bool(has_prefill_workspace)),
        int(valid_counts is not None),
        int(second is not None),
        int(same),
        idx.numel() if idx is not None else 0,
        int(idx is not None),
        inputs.get("dcp_size", 1),
        inputs.get("dcp_rank", 0),
        inputs.get("dcp_interleave", 1),
        inputs.get("prefill_rank_stride", 0),
        k,
        int(compact),
        int(prefill),
        int(inputs.get("dcp_size", 1) > 1),
    )
    consts = {"TILE": tile, "KEY1": _KEYS[0], "KEY2": _KEYS[1]}
    (launchers or Launchers())(_check_convert)(n, args, consts)


def _reads(token_indices: torch.Tensor, block_table: torch.Tensor, out: torch.Tensor, valid_counts) -> bool:
    """Whether the kernel reads this layout: int32 ``out`` [N, K] and ``valid_counts`` [N] on the
    indices' device and a block table to index (empty rows aside); any K (a last tile is masked)."""
    n, k = token_indices.shape
    if out.shape != (n, k) or out.dtype != torch.int32 or out.device != token_indices.device:
        return False
    if valid_counts is not None and (
        valid_counts.shape != (n,) or valid_counts.dtype != torch.int32 or valid_counts.device != token_indices.device
    ):
        return False
    return n == 0 or k == 0 or block_table.numel() > 0


def convert_rows_flag(
    *,
    out: torch.Tensor,
    valid_counts: torch.Tensor | None,
    flag: torch.Tensor | None = None,
    launchers: Launchers | None = None,
    block_stride_rows: int | None = None,
    compact: bool = False,
    second: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    same: bool = False,
    **inputs: Any,
) -> torch.Tensor | None:
    """A device flag, nonzero when out (or valid_counts) differ from the oracle's; None when this
    check cannot tell (odd shapes or dtypes: the full check decides). No host synchronization.
    ``inputs``: the call's (``req_id``, ``block_table``, ``token_indices``, ``block_size``,
    ``has_prefill_workspace``, ``prefill_workspace_request_ids``, ``prefill_workspace_starts``).
    ``flag``: a zeroed int tensor on out's device to set (its element 0) instead of a new one.
    ``block_stride_rows``: SPEC 7's stride (None: block_size); ``compact``: rows compacted to the
    front (SPEC 7), judged as multisets with a -1 tail (the module docstring). ``second``: a
    re-run's (out, valid_counts), judged in the same launch; ``same``: its compacted rows must
    also be the first run's bit for bit (a caller's buffer: the write map's NONDETERMINISM)."""
    ti = inputs["token_indices"]
    runs = [(out, valid_counts)] + ([second] if second is not None else [])
    if any(not _reads(ti, inputs["block_table"], o, c) or (c is None) != (valid_counts is None) for o, c in runs):
        return None
    if out.numel() == 0:
        if valid_counts is None:
            return flag if flag is not None else torch.zeros((), dtype=torch.bool, device=out.device)
        nonzero = (valid_counts != 0).any()
        if second is not None:
            nonzero |= (second[1] != 0).any()
        if flag is None:
            return nonzero
        flag[:1].copy_(nonzero.reshape(1))
        return flag
    bad = flag if flag is not None else torch.zeros(1, dtype=torch.int32, device=out.device)
    _launch(
        inputs=inputs,
        out=out.contiguous(),
        valid_counts=valid_counts,
        bad=bad,
        launchers=launchers,
        block_stride_rows=block_stride_rows,
        compact=compact,
        prefill=False,
        second=(second[0].contiguous(), second[1]) if second is not None else None,
        same=same,
    )
    return bad


def convert_prefill(
    *,
    out: torch.Tensor,
    valid_counts: torch.Tensor | None,
    undecided: torch.Tensor,
    launchers: Launchers | None = None,
    block_stride_rows: int | None = None,
    **inputs: Any,
) -> bool:
    """Fill the caller's ``out`` with a value per row that is neither -1 nor any slot the row
    expects, and ``valid_counts`` with -1 - count (neither the count nor, the count added into it,
    the count again): outputs ``convert_rows_flag`` then passes were written at every element.
    ``undecided`` (a zeroed device int tensor): element 0 set to 2 where a row expects both int32
    extremes (no such value). False (nothing written): a layout it does not write. No sync."""
    ti = inputs["token_indices"]
    if not _reads(ti, inputs["block_table"], out, valid_counts) or (out.numel() and out.stride(1) != 1):
        return False
    if valid_counts is not None and not valid_counts.is_contiguous():
        return False
    if out.numel() == 0:
        if valid_counts is not None:
            valid_counts.fill_(-1)  # no columns: every count is 0 (no rows: nothing to fill)
        return True
    _launch(
        inputs=inputs,
        out=out,
        valid_counts=valid_counts,
        bad=undecided,
        launchers=launchers,
        block_stride_rows=block_stride_rows,
        compact=False,
        prefill=True,
    )
    return True
