"""Triton convert: request-local top-k token indices -> global KV-cache slots.

SPEC §3. ``convert(...)`` has vLLM's exact keyword names and rejects every
precondition violation on the host before launching (``checks.CONVERT_REJECTS``).

Kernel design (for the H200; memory bound, ~8 bytes moved per element):

- one program per row; the program walks the row's K columns in tiles of
  ``TILE`` columns (a power-of-two multiple of ``BLOCK_N`` that divides K, at
  most ``_MAX_TILE``), so the per-row scalars (req, prefill start, table row
  pointer) are loaded once and the valid count is accumulated in registers
  and stored once per row;
- index math is int32 like vLLM (``block_table[req, blk] * BLOCK_SIZE + off``
  and ``prefill_start + tok`` wrap in int32); pointer offsets that scale with
  a row index or a stride are int64, so large tensors cannot overflow them;
- negative tokens are masked before the division, and the block-table load
  is masked with ``0 <= blk < M``, so no input makes it read out of bounds.

Measured on the H200 (torch 2.11, triton 3.6; do_bench_cudagraph; N=4096,
K=2048, bs=64, 64 requests x 2560 blocks): 20.8 us against 17.6 us for a
device-to-device copy of token_indices (3.8 TB/s), i.e. 84% of copy
bandwidth; 23.4 us (75%) with return_valid_counts; 22.7 us (77%) with prefill
rows and counts. TILE 512..2048 at 4 warps were equal; 8 or 16 warps slower.
With the block size, prefill rows, counts and the stride as runtime values
(2026-12-02, ``mlafuzz bench --op convert``, with counts): 24.9 us against a
22.8 us copy on that machine, 92%.

Later options (SPEC section 7), both off by default:

- ``BLOCK_STRIDE_ROWS`` (vLLM's name and place in the signature; None means
  BLOCK_SIZE): a cache slot is ``block_table[req, blk] * BLOCK_STRIDE_ROWS +
  off``, still int32; a runtime argument, not a constexpr, so a fuzz run over
  many strides compiles one kernel; prefill rows (workspace offsets) ignore it;
- ``COMPACT_TO_FRONT`` (keyword only; vLLM reaches compaction only through its
  DCP variant): a row's valid values are packed at its front, -1 after, and
  valid_counts stays exact. The row's program packs each tile with a prefix
  sum of its valid mask, after the row's count so far, then writes -1 from
  the row's count to K: the order is column order (deterministic, though the
  contract leaves it unspecified) and no atomics are needed, since one program
  owns the row.

Newer surfaces (SPEC 9): ``out`` / ``valid_counts_out`` (9.2), the caller's buffers, are
written in full and returned (a buffer whose columns are not at unit stride gets the result
copied in); ``filter_and_convert_dcp`` (9.4, vLLM's ``triton_filter_and_convert_dcp_index``
signature) runs the same kernel with a DCP constexpr: each token de-interleaved to its owning
rank and local index, another rank's token invalid.

Semantics beyond the SPEC (documented choices, never reached by valid input):
a row whose ``req`` lies outside ``[0, R)`` reads no table entry and yields -1
in every column that would have read one; a prefill row whose workspace id
lies outside ``[0, len(prefill_workspace_starts))`` yields -1 in every column.
Both keep the kernel from reading out of bounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlafuzz.kernels.checks import CONVERT_REJECTS, check_convert_args, check_dcp_filter_args, check_release_args
from mlafuzz.kernels.revisions import compacts_counted, filter_compacts

__all__ = ["convert", "filter_and_convert_dcp", "CONVERT_REJECTS", "INTERPRETED", "pick_tile"]

_MAX_TILE = 2048  # columns per loop iteration; wide tiles keep many loads in flight
_NUM_WARPS = 4
_INT32_SPAN = 2**31


def pick_tile(k: int, block_n: int, max_tile: int = _MAX_TILE) -> int:
    """Widest power-of-two multiple of block_n that divides k, capped at max_tile.

    Always at least block_n (block_n may exceed max_tile; k % block_n == 0).
    """
    tile = block_n
    while tile * 2 <= max_tile and k % (tile * 2) == 0:
        tile *= 2
    return tile


# One compiled variant serves many calls. A fuzz run at realistic sizes draws K, the block size,
# prefill rows, counts, a block stride and compaction independently, and with each one a
# constexpr the run compiled a new kernel every few cases (on the H200: 121 compiles in 86 cases,
# 2.1 cases/s). So only K (its loop bound: Triton 3.6's CPU interpreter cannot loop to a runtime
# bound), TILE (from K and BLOCK_N), compaction (another store pattern) and whether the block
# size is a power of two (shift and mask, else division) are constexprs; the rest are runtime
# scalars that are not specialized on (== 1, % 16), and the pointers only read a scalar per row
# are not specialized on alignment. The column strides and the rows of token_indices and out stay
# specialized: their == 1 and % 16 are what vectorize the row loads and stores.
_RUNTIME_SCALARS = [
    "num_reqs",
    "max_blocks",
    "num_prefill_starts",
    "req_stride",
    "bt_stride0",
    "pid_stride",
    "ps_stride",
    "block_size",
    "block_shift",
    "block_stride",
    "has_prefill",
    "return_counts",
    "dcp_size",
    "dcp_rank",
    "interleave",
    "rank_stride",
    "num_idx",
    "has_idx",
]
_SCALAR_POINTERS = ["req_id_ptr", "valid_counts_ptr", "prefill_ids_ptr", "prefill_starts_ptr", "idx_mapping_ptr"]


@triton.jit(do_not_specialize=_RUNTIME_SCALARS, do_not_specialize_on_alignment=_SCALAR_POINTERS)
def _convert_kernel(
    req_id_ptr,
    block_table_ptr,
    token_indices_ptr,
    out_ptr,
    valid_counts_ptr,
    prefill_ids_ptr,
    prefill_starts_ptr,
    idx_mapping_ptr,  # SPEC 10 (vLLM 0.33.0): each request's table row, when has_idx
    num_reqs,  # R: rows of block_table
    max_blocks,  # M: columns of block_table
    num_prefill_starts,  # len(prefill_workspace_starts)
    req_stride,
    bt_stride0,
    bt_stride1,
    ti_stride0,
    ti_stride1,
    pid_stride,
    ps_stride,
    out_stride0,
    block_size,  # BLOCK_SIZE
    block_shift,  # log2(BLOCK_SIZE) when BS_POW2
    block_stride,  # BLOCK_STRIDE_ROWS, or BLOCK_SIZE when it is not passed
    has_prefill,  # HAS_PREFILL_WORKSPACE (0 / 1)
    return_counts,  # return_valid_counts (0 / 1)
    dcp_size,  # SPEC 9.4 (when DCP): ranks
    dcp_rank,  # this rank
    interleave,  # tokens per rank in turn (cp_kv_cache_interleave_size)
    rank_stride,  # (when DCP) rows per rank of the gathered prefill workspace
    num_idx,  # len(idx_mapping)
    has_idx,  # idx_mapping given (0 / 1)
    K: tl.constexpr,
    TILE: tl.constexpr,
    BS_POW2: tl.constexpr,
    TI_COL_I64: tl.constexpr,  # column offsets of token_indices need int64
    COMPACT: tl.constexpr,
    DCP: tl.constexpr,  # filter to this rank's tokens, as local indices (SPEC 9.4)
):
    row = tl.program_id(0).to(tl.int64)
    req = tl.load(req_id_ptr + row * req_stride)
    # Through idx_mapping the table row is max(idx_mapping[req], 0); a req outside the mapping reads
    # nothing (-1: no table row), as a req outside the table does.
    idx_ok = (req >= 0) & (req < num_idx) & (has_idx != 0)
    mapped = tl.maximum(tl.load(idx_mapping_ptr + tl.where(idx_ok, req, 0).to(tl.int64), mask=idx_ok, other=-1), 0)
    req = tl.where(has_idx != 0, tl.where(idx_ok, mapped, -1), req)
    req_ok = (req >= 0) & (req < num_reqs)
    # Clamp so the row pointer is in bounds even when req is not; loads from it
    # are masked with req_ok anyway.
    bt_row_ptr = block_table_ptr + tl.where(req_ok, req, 0).to(tl.int64) * bt_stride0
    ti_row_ptr = token_indices_ptr + row * ti_stride0
    out_row_ptr = out_ptr + row * out_stride0

    # Without a prefill workspace no row is a prefill row: the id reads as -1 (its pointer, then
    # req_id's, is never dereferenced).
    pref = tl.load(prefill_ids_ptr + row * pid_stride, mask=has_prefill != 0, other=-1)
    is_prefill = pref >= 0
    pref_ok = is_prefill & (pref < num_prefill_starts)
    pref_start = tl.load(
        prefill_starts_ptr + tl.where(pref_ok, pref, 0).to(tl.int64) * ps_stride,
        mask=pref_ok,
        other=0,
    )
    # Prefill rows take their value from the workspace, never the table.
    row_ok = tl.where(is_prefill, pref_ok, req_ok)
    table_row = req_ok & (pref < 0)

    cols = tl.arange(0, TILE)
    count = 0
    for start in tl.range(0, K, TILE):
        c = start + cols
        if TI_COL_I64:
            tok = tl.load(ti_row_ptr + c.to(tl.int64) * ti_stride1)
        else:
            tok = tl.load(ti_row_ptr + c * ti_stride1)
        nonneg = tok >= 0
        # Divide only non-negative values: floor vs trunc never matters, and a
        # negative token never becomes a table index.
        tok_s = tl.where(nonneg, tok, 0)
        tok_l = tok_s  # the index into this rank's share of the request (all of it without DCP)
        pref_val = pref_start + tok_s
        if DCP:
            group = tok_s // interleave
            owner = group % dcp_size
            tok_l = (group // dcp_size) * interleave + tok_s % interleave
            # Another rank's decode token is invalid; a prefill token of any rank sits in the
            # rank-major all-gathered workspace (vLLM 0.30.0's plain convert).
            nonneg = nonneg & ((owner == dcp_rank) | is_prefill)
            pref_val = owner * rank_stride + pref_start + tok_l
        if BS_POW2:
            blk = tok_l >> block_shift
            off = tok_l & (block_size - 1)
        else:
            blk = tok_l // block_size
            off = tok_l % block_size
        valid = nonneg & (blk < max_blocks) & row_ok
        # `!= False` makes the mask a bool array under the CPU interpreter: there a scalar  # noqa: E712 (a bool mask: see above)
        # predicate (row_ok, table_row) broadcast into a block is an integer array, which
        # Triton >= 3.7's interpreter rejects as a mask. Compiled, the i1 compare folds away
        # (against 0 it would widen to i32 first and survive until LLVM).
        base = tl.load(
            bt_row_ptr + blk.to(tl.int64) * bt_stride1,
            mask=(valid & table_row) != False,  # noqa: E712 (a bool mask: see above)
            other=0,
        )
        # int32, wrapping like vLLM's `block_table[req, blk] * BLOCK_SIZE + off`.
        val = tl.where(is_prefill, pref_val, base * block_stride + off)
        if COMPACT:
            # Valid column j of this tile goes to the row's count so far plus its rank among the
            # tile's valid columns: distinct slots, all below the row's final count.
            v = valid.to(tl.int32)
            dest = count + tl.cumsum(v, axis=0) - 1
            tl.store(out_row_ptr + dest, val, mask=valid != False)  # noqa: E712 (a bool mask, as above)
            count += tl.sum(v, axis=0)
        else:
            tl.store(out_row_ptr + c, tl.where(valid, val, -1))
            if return_counts != 0:  # a uniform branch: a launch without counts pays no reduction
                count += tl.sum(valid.to(tl.int32), axis=0)

    if COMPACT:
        # The tail: columns from the row's count on. Disjoint from the packed prefix, so the
        # order of the two passes' stores does not matter.
        for start in tl.range(0, K, TILE):
            c = start + cols
            tl.store(out_row_ptr + c, tl.full([TILE], -1, tl.int32), mask=c >= count)

    tl.store(valid_counts_ptr + row, count, mask=return_counts != 0)


# TRITON_INTERPRET=1 at decoration time gives an interpreted kernel (CPU
# tensors only work then); otherwise the kernel compiles for the GPU.
INTERPRETED = type(_convert_kernel).__name__ == "InterpretedFunction"


def convert(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    BLOCK_SIZE: int = 64,
    BLOCK_STRIDE_ROWS: int | None = None,
    NUM_TOPK_TOKENS: int = 2048,
    BLOCK_N: int = 128,
    HAS_PREFILL_WORKSPACE: bool = False,
    prefill_workspace_request_ids: torch.Tensor | None = None,
    prefill_workspace_starts: torch.Tensor | None = None,
    return_valid_counts: bool = False,
    *,
    COMPACT_TO_FRONT: bool = False,
    out: torch.Tensor | None = None,
    valid_counts_out: torch.Tensor | None = None,
    revision: str | None = None,
    idx_mapping: torch.Tensor | None = None,
    prefill_workspace_rank_stride: int | None = None,
    dcp_size: int = 1,
    dcp_rank: int = 0,
    cp_kv_cache_interleave_size: int = 1,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Map request-local top-k indices to global cache slots (SPEC §3, §7 for the options).

    Returns ``out`` int32 [N, K] (freshly allocated, contiguous), and
    ``valid_counts`` int32 [N] too when ``return_valid_counts``. Inputs may
    have any strides. Raises ``checks.InvalidInputError`` (a ValueError; a
    TypeError too for dtype problems; an AssertionError too where vLLM
    asserts) before launching for every class in ``CONVERT_REJECTS``. Values
    (req >= R, tok >= seq_len, ...) are not checked on the host: that would
    need a device sync. ``BLOCK_STRIDE_ROWS`` and ``COMPACT_TO_FRONT``: see
    the module docstring. ``out`` / ``valid_counts_out`` (SPEC 9.2): the caller's buffers
    (any row stride), every element written and returned; the counts only when returned.
    ``revision``: the contract revision whose ``convert_counted`` rule it follows (``compact``, vLLM
    0.30.0 on: a counted row compacted as by COMPACT_TO_FRONT); None: in place. The releases'
    arguments (SPEC 10): ``idx_mapping`` and the DCP layout (``dcp_size`` > 1 runs the kernel's
    DCP variant: another rank's decode token -1, a prefill token in the rank-major workspace).
    """
    check_convert_args(
        req_id,
        block_table,
        token_indices,
        BLOCK_SIZE,
        NUM_TOPK_TOKENS,
        BLOCK_N,
        HAS_PREFILL_WORKSPACE,
        prefill_workspace_request_ids,
        prefill_workspace_starts,
        BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
        out=out,
        valid_counts_out=valid_counts_out,
    )
    d, rank, inter, rank_stride = check_release_args(
        idx_mapping=idx_mapping,
        dcp_size=dcp_size,
        dcp_rank=dcp_rank,
        interleave=cp_kv_cache_interleave_size,
        rank_stride=prefill_workspace_rank_stride,
        device=token_indices.device,
    )
    n, k = token_indices.shape
    device = token_indices.device
    given = out
    # The kernel stores a row's columns at unit stride: a caller's buffer with another column
    # stride gets a fresh row-major result copied in.
    if out is None or out.stride(1) != 1:
        out = torch.empty((n, k), dtype=torch.int32, device=device)
    counts = None
    if return_valid_counts:
        mine = valid_counts_out is None or valid_counts_out.stride(0) != 1
        counts = torch.empty((n,), dtype=torch.int32, device=device) if mine else valid_counts_out
    given_counts = valid_counts_out if return_valid_counts else None
    if n == 0 or k == 0:
        if counts is not None:
            counts.zero_()
        return _returned(out, counts, given, given_counts)
    if device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            f"token_indices.device={device}: the compiled Triton kernel needs GPU tensors; for CPU "
            "tensors set TRITON_INTERPRET=1 before triton is first imported"
        )

    launch(
        req_id,
        block_table,
        token_indices,
        out,
        counts,
        BLOCK_SIZE=BLOCK_SIZE,
        BLOCK_N=BLOCK_N,
        HAS_PREFILL_WORKSPACE=HAS_PREFILL_WORKSPACE,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
        grid_rows=n,
        BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
        COMPACT_TO_FRONT=bool(COMPACT_TO_FRONT) or (bool(return_valid_counts) and compacts_counted(revision)),
        DCP=(d, rank, inter) if d > 1 else None,  # D = 1: every token is this rank's, at its own index
        idx_mapping=idx_mapping,
        rank_stride=rank_stride,
    )
    return _returned(out, counts, given, given_counts)


def _returned(
    out: torch.Tensor, counts: torch.Tensor | None, given: torch.Tensor | None, given_counts: torch.Tensor | None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The results, in the caller's buffers where given (copied in where the kernel could not
    store into them directly)."""
    if given is not None and given is not out:
        out = given.copy_(out)
    if counts is not None and given_counts is not None and given_counts is not counts:
        counts = given_counts.copy_(counts)
    return out if counts is None else (out, counts)


def filter_and_convert_dcp(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    dcp_size: int,
    dcp_rank: int,
    cp_kv_cache_interleave_size: int = 1,
    BLOCK_SIZE: int = 64,
    BLOCK_STRIDE_ROWS: int | None = None,
    NUM_TOPK_TOKENS: int = 2048,
    BLOCK_N: int = 128,
    return_valid_counts: bool = False,
    compact_valid_to_front: bool = True,
    *,
    revision: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SPEC 9.4's DCP filter with vLLM's ``triton_filter_and_convert_dcp_index`` signature: the same
    kernel, each token de-interleaved to its owner and local index first (DCP constexpr); another
    rank's token is -1. ``BLOCK_STRIDE_ROWS`` as the plain convert's. Compaction as
    ``COMPACT_TO_FRONT`` at D > 1; at D == 1 vLLM hands the call to its plain convert, which drops
    ``compact_valid_to_front`` and packs a counted row only under ``revision``'s
    ``convert_counted = compact`` (kernels/revisions.py ``filter_compacts``)."""
    check_dcp_filter_args(
        req_id, block_table, token_indices, dcp_size, dcp_rank, cp_kv_cache_interleave_size, BLOCK_SIZE,
        NUM_TOPK_TOKENS, BLOCK_N, BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
    )  # fmt: skip
    compact = filter_compacts(dcp_size, compact_valid_to_front, return_valid_counts, revision)
    n, k = token_indices.shape
    device = token_indices.device
    out = torch.empty((n, k), dtype=torch.int32, device=device)
    counts = torch.zeros((n,), dtype=torch.int32, device=device) if return_valid_counts else None
    if n and k:
        if device.type == "cpu" and not INTERPRETED:
            raise RuntimeError(f"token_indices.device={device}: set TRITON_INTERPRET=1 for CPU tensors")
        launch(
            req_id, block_table, token_indices, out, counts, BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N,
            HAS_PREFILL_WORKSPACE=False, prefill_workspace_request_ids=None, prefill_workspace_starts=None,
            grid_rows=n, BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS, COMPACT_TO_FRONT=compact,
            DCP=(dcp_size, dcp_rank, cp_kv_cache_interleave_size),
        )  # fmt: skip
    return (out, counts) if counts is not None else out


def launch(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    out: torch.Tensor,
    counts: torch.Tensor | None,
    *,
    BLOCK_SIZE: int,
    BLOCK_N: int,
    HAS_PREFILL_WORKSPACE: bool,
    prefill_workspace_request_ids: torch.Tensor | None,
    prefill_workspace_starts: torch.Tensor | None,
    grid_rows: int,
    BLOCK_STRIDE_ROWS: int | None = None,
    COMPACT_TO_FRONT: bool = False,
    DCP: tuple[int, int, int] | None = None,
    idx_mapping: torch.Tensor | None = None,
    rank_stride: int = 0,
) -> None:
    """Launch the kernel over ``grid_rows`` rows with no checks (``convert`` checks first).

    Separate so that planted-bug variants (kernels/mutants.py) can reproduce
    launch mistakes, such as a grid sized from req_id rather than from out. ``DCP``: (dcp_size,
    dcp_rank, interleave) of SPEC 9.4's filter, or of the plain convert's DCP arguments (SPEC 10,
    with ``rank_stride`` for its prefill rows); None: no DCP. ``idx_mapping``: SPEC 10's.
    """
    n, k = token_indices.shape
    return_valid_counts = counts is not None
    has_prefill = bool(HAS_PREFILL_WORKSPACE)
    # Unused pointers still need a tensor on the right device; the constexpr
    # flags remove every access to them.
    ids = prefill_workspace_request_ids if has_prefill else req_id
    starts = prefill_workspace_starts if has_prefill else req_id
    counts_arg = counts if counts is not None else out
    num_reqs, max_blocks = block_table.shape
    ti_col_i64 = (k - 1) * token_indices.stride(1) >= _INT32_SPAN
    _convert_kernel[(grid_rows,)](
        req_id,
        block_table,
        token_indices,
        out,
        counts_arg,
        ids,
        starts,
        idx_mapping if idx_mapping is not None else req_id,
        num_reqs,
        max_blocks,
        starts.shape[0],
        req_id.stride(0),
        block_table.stride(0),
        block_table.stride(1),
        token_indices.stride(0),
        token_indices.stride(1),
        ids.stride(0),
        starts.stride(0),
        out.stride(0),
        BLOCK_SIZE,
        BLOCK_SIZE.bit_length() - 1,
        BLOCK_SIZE if BLOCK_STRIDE_ROWS is None else BLOCK_STRIDE_ROWS,
        int(has_prefill),
        int(return_valid_counts),
        *(DCP or (1, 0, 1)),
        rank_stride,
        0 if idx_mapping is None else idx_mapping.shape[0],
        int(idx_mapping is not None),
        K=k,
        TILE=pick_tile(k, BLOCK_N),
        BS_POW2=BLOCK_SIZE & (BLOCK_SIZE - 1) == 0,
        TI_COL_I64=ti_col_i64,
        COMPACT=COMPACT_TO_FRONT,
        DCP=DCP is not None,
        num_warps=_NUM_WARPS,
    )
