"""A Triton convert that compiles per shape, as vLLM's does: the look-alike issue #29 measures with.

vLLM's ``triton_convert_req_index_to_global_index`` (sparse_utils.py, 02a26fa06df2) passes every
option of a call to its kernel as a ``tl.constexpr``: the block table's width
(``max_num_blocks_per_req``), BLOCK_SIZE, BLOCK_STRIDE_ROWS, BLOCK_N, the prefill flag, whether it
counts valid slots, and whether one program owns a whole row (when it counts and K is a power of
two); its strides are plain ints, which Triton specializes on divisibility by 16 and on the value 1,
and nothing is in ``do_not_specialize``. So each new combination a fuzzer draws is a new compile.
This file is written from those facts (the public signature and keyword options, the asserts,
the grid), not copied: the project's own convert takes runtime values instead, and a user's
kernel will not, which is what ``mlafuzz fuzz --impl convert=THIS_FILE:convert`` measures.

Two entry points:

- ``convert``: after vLLM PR #48642, it asserts that req_id and token_indices have the same rows;
- ``convert_prefix_bug``: the launch before that fix, a grid over req_id's rows with no such
  check, so a longer req_id reads past token_indices and writes past ``out`` (the
  ``length_mismatch`` error input finds it: ACCEPTED_INVALID_INPUT, and on a GPU with --redzone
  the write itself).

Runs on a GPU, and on the CPU under TRITON_INTERPRET=1 (set before triton is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _convert_kernel(
    req_id_ptr,
    table_ptr,
    indices_ptr,
    out_ptr,
    counts_ptr,
    prefill_req_ptr,
    prefill_starts_ptr,
    table_stride0,
    table_stride1,
    indices_stride0,
    indices_stride1,
    out_stride0,
    out_stride1,
    MAX_BLOCKS: tl.constexpr,  # the block table's width: one compile per width, as vLLM's
    BLOCK_SIZE: tl.constexpr,
    BLOCK_STRIDE_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_PREFILL: tl.constexpr,
    COUNT_VALID: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    req = tl.load(req_id_ptr + row)
    tok = tl.load(indices_ptr + row * indices_stride0 + cols * indices_stride1)
    block = tok // BLOCK_SIZE
    offset = tok % BLOCK_SIZE
    in_table = (block >= 0) & (block < MAX_BLOCKS)
    invalid = (tok < 0) | ~in_table
    prefill = cols < 0  # all False, of the tile's shape
    if HAS_PREFILL:
        prefill_req = tl.load(prefill_req_ptr + row)
        prefill = (prefill_req + cols * 0) >= 0  # the row's flag on each lane of the tile
    slot = tl.load(table_ptr + req * table_stride0 + block * table_stride1, mask=in_table & ~prefill, other=0)
    value = slot * BLOCK_STRIDE_ROWS + offset
    if HAS_PREFILL:
        start = tl.load(prefill_starts_ptr + prefill_req + cols * 0, mask=prefill, other=0)  # a tile: any Triton
        value = tl.where(prefill, start + tok, value)
    value = tl.where(invalid, -1, value)
    tl.store(out_ptr + row * out_stride0 + cols * out_stride1, value)
    if COUNT_VALID:
        valid = tl.sum((~invalid).to(tl.int32), axis=0)
        if SINGLE_TILE:
            tl.store(counts_ptr + row, valid)
        else:
            tl.atomic_add(counts_ptr + row, valid)


def _launch(
    req_id,
    block_table,
    token_indices,
    *,
    BLOCK_SIZE,
    BLOCK_STRIDE_ROWS,
    NUM_TOPK_TOKENS,
    BLOCK_N,
    HAS_PREFILL_WORKSPACE,
    prefill_workspace_request_ids,
    prefill_workspace_starts,
    return_valid_counts,
    check_rows,
):
    assert req_id.dtype == torch.int32
    assert block_table.dtype == torch.int32
    assert token_indices.dtype == torch.int32
    if check_rows:  # the PR #48642 fix: the grid is sized by req_id, out like token_indices
        assert req_id.shape[0] == token_indices.shape[0], "req_id and token_indices must cover the same tokens"
    assert token_indices.shape[1] == NUM_TOPK_TOKENS
    assert NUM_TOPK_TOKENS % BLOCK_N == 0, "NUM_TOPK_TOKENS must be a multiple of BLOCK_N"
    if HAS_PREFILL_WORKSPACE:
        assert prefill_workspace_request_ids is not None and prefill_workspace_starts is not None
        assert prefill_workspace_request_ids.dtype == torch.int32
        assert prefill_workspace_starts.dtype == torch.int32
    single_tile = bool(return_valid_counts) and triton.next_power_of_2(NUM_TOPK_TOKENS) == NUM_TOPK_TOKENS
    block_n, tiles = (NUM_TOPK_TOKENS, 1) if single_tile else (BLOCK_N, NUM_TOPK_TOKENS // BLOCK_N)
    req = req_id.contiguous()
    table = block_table.contiguous()
    indices = token_indices.contiguous()
    out = torch.empty_like(indices)
    counts = None
    if return_valid_counts:
        counts = (torch.empty if single_tile else torch.zeros)(req.shape[0], dtype=torch.int32, device=indices.device)
    _convert_kernel[(req.shape[0], tiles)](
        req,
        table,
        indices,
        out,
        counts,
        prefill_workspace_request_ids if HAS_PREFILL_WORKSPACE else None,
        prefill_workspace_starts if HAS_PREFILL_WORKSPACE else None,
        *table.stride(),
        *indices.stride(),
        *out.stride(),
        MAX_BLOCKS=table.shape[1],
        BLOCK_SIZE=BLOCK_SIZE,
        BLOCK_STRIDE_ROWS=BLOCK_SIZE if BLOCK_STRIDE_ROWS is None else BLOCK_STRIDE_ROWS,
        BLOCK_N=block_n,
        HAS_PREFILL=bool(HAS_PREFILL_WORKSPACE),
        COUNT_VALID=bool(return_valid_counts),
        SINGLE_TILE=single_tile,
        num_warps=8 if single_tile else 4,
    )
    return (out, counts) if return_valid_counts else out


def convert(
    req_id,
    block_table,
    token_indices,
    BLOCK_SIZE=64,
    BLOCK_STRIDE_ROWS=None,
    NUM_TOPK_TOKENS=2048,
    BLOCK_N=128,
    HAS_PREFILL_WORKSPACE=False,
    prefill_workspace_request_ids=None,
    prefill_workspace_starts=None,
    return_valid_counts=False,
):
    """vLLM's public signature and keyword options; correct (after PR #48642)."""
    return _launch(
        req_id,
        block_table,
        token_indices,
        BLOCK_SIZE=BLOCK_SIZE,
        BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
        NUM_TOPK_TOKENS=NUM_TOPK_TOKENS,
        BLOCK_N=BLOCK_N,
        HAS_PREFILL_WORKSPACE=HAS_PREFILL_WORKSPACE,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
        return_valid_counts=return_valid_counts,
        check_rows=True,
    )


def convert_prefix_bug(
    req_id,
    block_table,
    token_indices,
    BLOCK_SIZE=64,
    BLOCK_STRIDE_ROWS=None,
    NUM_TOPK_TOKENS=2048,
    BLOCK_N=128,
    HAS_PREFILL_WORKSPACE=False,
    prefill_workspace_request_ids=None,
    prefill_workspace_starts=None,
    return_valid_counts=False,
):
    """The launch before PR #48642: a grid over req_id's rows, no length check."""
    return _launch(
        req_id,
        block_table,
        token_indices,
        BLOCK_SIZE=BLOCK_SIZE,
        BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
        NUM_TOPK_TOKENS=NUM_TOPK_TOKENS,
        BLOCK_N=BLOCK_N,
        HAS_PREFILL_WORKSPACE=HAS_PREFILL_WORKSPACE,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
        return_valid_counts=return_valid_counts,
        check_rows=False,
    )
