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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.launch import Launchers
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.ops.op import Outputs

_KEYS = (0x2545F491, 0x6C8E9CF5)  # the two mixes' keys: any two distinct 32-bit values


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
# of token_indices and out are (their == 1 and alignment vectorize the loads). K stays a
# constexpr, as in the kernel.
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
    ],
    do_not_specialize_on_alignment=["req_ptr", "table_ptr", "counts_ptr", "pw_ptr", "ps_ptr", "bad_ptr"],
)
def _check_convert(
    req_ptr,
    table_ptr,
    ti_ptr,
    out_ptr,
    counts_ptr,
    pw_ptr,
    ps_ptr,
    bad_ptr,
    num_reqs,
    max_blocks,
    num_starts,
    table_s0,
    table_s1,
    ti_s0,
    ti_s1,
    out_s0,
    block_size,
    block_stride,
    has_prefill,  # 0 / 1: prefill rows exist only with a prefill workspace
    has_counts,  # 0 / 1: valid_counts is checked too
    K: tl.constexpr,
    TILE: tl.constexpr,
    COMPACT: tl.constexpr,
    KEY1: tl.constexpr,
    KEY2: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    req = tl.load(req_ptr + row).to(tl.int64)
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
    for c0 in tl.range(0, K, TILE):
        c = c0 + cols
        tok = tl.load(ti_ptr + row * ti_s0 + c * ti_s1).to(tl.int64)
        nonneg = tok >= 0
        t0 = tl.where(nonneg, tok, 0)
        blk = t0 // block_size
        off = t0 - blk * block_size
        valid = nonneg & (blk < max_blocks) & row_ok
        # `!= False`: a bool mask under the CPU interpreter, where the scalars row_ok and is_pf  # noqa: E712 (a bool mask: see above)
        # broadcast into integer arrays, which Triton >= 3.7's interpreter rejects as a mask;
        # compiled, the i1 compare folds away.
        base = tl.load(
            table_ptr + tl.where(row_ok & ~is_pf, req, 0) * table_s0 + blk * table_s1,
            mask=(valid & ~is_pf) != False,
            other=0,
        ).to(tl.int64)  # noqa: E712 (a bool mask: see above)
        value = tl.where(is_pf, start + tok, base * block_stride + off)
        expected = tl.where(valid, value.to(tl.int32), -1)
        if COMPACT:
            sig1 += tl.sum(tl.where(valid, _mix(expected, KEY1), 0), axis=0)
            sig2 += tl.sum(tl.where(valid, _mix(expected, KEY2), 0), axis=0)
        else:
            actual = tl.load(out_ptr + row * out_s0 + c)
            bad += tl.sum((expected != actual).to(tl.int32), axis=0)
        valid_n += tl.sum(valid.to(tl.int32), axis=0)
    if COMPACT:  # the row's first valid_n values against the signatures, -1 after them
        for c0 in tl.range(0, K, TILE):
            c = c0 + cols
            actual = tl.load(out_ptr + row * out_s0 + c)
            front = c < valid_n
            sig1 -= tl.sum(tl.where(front, _mix(actual, KEY1), 0), axis=0)
            sig2 -= tl.sum(tl.where(front, _mix(actual, KEY2), 0), axis=0)
            bad += tl.sum((~front & (actual != -1)).to(tl.int32), axis=0)
        bad += ((sig1 != 0) | (sig2 != 0)).to(tl.int32)
    counted = tl.load(counts_ptr + row, mask=has_counts != 0, other=0)
    bad += ((has_counts != 0) & (counted != valid_n)).to(tl.int32)
    tl.store(bad_ptr, 1, mask=bad != 0)  # a flag, no array to reduce afterwards


def convert_rows_flag(
    *,
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    block_size: int,
    has_prefill_workspace: bool,
    prefill_workspace_request_ids,
    prefill_workspace_starts,
    out: torch.Tensor,
    valid_counts: torch.Tensor | None,
    flag: torch.Tensor | None = None,
    launchers: Launchers | None = None,
    block_stride_rows: int | None = None,
    compact: bool = False,
) -> torch.Tensor | None:
    """A device flag, nonzero when out (or valid_counts) differ from the oracle's; None when this
    check cannot tell (odd shapes or dtypes: the full check decides). No host synchronization.
    ``flag``: a zeroed int tensor on out's device to set (its element 0) instead of a new one.
    ``block_stride_rows``: SPEC 7's stride (None: block_size); ``compact``: rows compacted to the
    front (SPEC 7), judged as multisets with a -1 tail (the module docstring)."""
    n, k = token_indices.shape
    if out.shape != (n, k) or out.dtype != torch.int32 or out.device != token_indices.device:
        return None
    if valid_counts is not None and (
        valid_counts.shape != (n,) or valid_counts.dtype != torch.int32 or valid_counts.device != token_indices.device
    ):
        return None
    if n == 0 or k == 0:
        if valid_counts is None:
            return flag if flag is not None else torch.zeros((), dtype=torch.bool, device=out.device)
        nonzero = (valid_counts != 0).any()
        if flag is None:
            return nonzero
        flag[:1].copy_(nonzero.reshape(1))
        return flag
    if block_table.numel() == 0:
        return None  # nothing to index: let the full path decide
    tile = min(triton.next_power_of_2(k), 1024)
    if k % tile:
        return None
    pw = prefill_workspace_request_ids if has_prefill_workspace else req_id
    ps = prefill_workspace_starts if has_prefill_workspace and prefill_workspace_starts.numel() else req_id
    num_starts = prefill_workspace_starts.numel() if has_prefill_workspace else 0
    bad = flag if flag is not None else torch.zeros(1, dtype=torch.int32, device=out.device)
    outc = out.contiguous()
    args = (
        req_id.contiguous(),
        block_table,
        token_indices,
        outc,
        valid_counts if valid_counts is not None else outc,
        pw.contiguous(),
        ps.contiguous(),
        bad,
        block_table.shape[0],
        block_table.shape[1],
        num_starts,
        block_table.stride(0),
        block_table.stride(1),
        token_indices.stride(0),
        token_indices.stride(1),
        outc.stride(0),
        block_size,
        block_size if block_stride_rows is None else block_stride_rows,
        int(bool(has_prefill_workspace)),
        int(valid_counts is not None),
    )
    (launchers or Launchers())(_check_convert)(
        n, args, {"K": k, "TILE": tile, "COMPACT": bool(compact), "KEY1": _KEYS[0], "KEY2": _KEYS[1]}
    )
    return bad


def takes(case: Case) -> bool:
    """Caller-owned outputs (SPEC 9.2: guarded buffers, two steps) go to the full path: its write
    map, guard zones and identity check are what judge them, and this check knows none of them."""
    return "out_steps" not in case.params


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    """The fast path's check of a convert call (convert has no guarded outputs: ``second`` is
    never given). False: it cannot tell from the host, nothing launched."""
    if second is not None:
        return False
    t, p = case.tensors, case.params
    out, counts = outputs.get("out"), outputs.get("valid_counts")
    if not isinstance(out, torch.Tensor) or (p["return_valid_counts"] and not isinstance(counts, torch.Tensor)):
        return False
    return (
        convert_rows_flag(
            req_id=t["req_id"],
            block_table=t["block_table"],
            token_indices=t["token_indices"],
            block_size=p["BLOCK_SIZE"],
            has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
            prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
            prefill_workspace_starts=t["prefill_workspace_starts"],
            out=out,
            valid_counts=counts if p["return_valid_counts"] else None,
            flag=flag,
            launchers=state.launchers,
            block_stride_rows=p.get("BLOCK_STRIDE_ROWS"),
            compact=bool(p.get("COMPACT_TO_FRONT")),
        )
        is not None
    )
