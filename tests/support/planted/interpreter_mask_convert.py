"""A Triton convert written the way vLLM writes its prefill branch, which Triton >= 3.7's CPU
interpreter cannot run: the environment's failure, not the implementation's.

vLLM's convert (sparse_utils.py) loads a prefill row's flag as a scalar
(``is_prefill = prefill_req_id >= 0``) and folds it into the tile's load mask
(``mask=valid_block & ~is_prefill``). Compiled, the scalar broadcasts into an i1 tile. Triton
3.9's interpreter makes the combination of a tile's bool with a scalar condition loaded from
memory something other than bool and refuses it as a mask ("mask has unsupported dtype"); 3.6's
ran it. So every case with a prefill workspace raises under the interpreter, and the harness must
call that an environment limit, not an EXCEPTION. Decode-only cases take a branch without the
scalar flag and run (and are correct), as they do in vLLM.

Runs on the CPU under TRITON_INTERPRET=1 (set before triton is imported), and on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlafuzz.kernels.checks import check_convert_args


@triton.jit
def _convert_kernel(
    req_id_ptr,
    table_ptr,
    indices_ptr,
    out_ptr,
    counts_ptr,
    prefill_req_ptr,
    prefill_starts_ptr,
    num_reqs,
    num_starts,
    max_blocks,
    table_stride0,
    indices_stride0,
    out_stride0,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_PREFILL: tl.constexpr,
    COUNT_VALID: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    req = tl.load(req_id_ptr + row) + cols * 0  # the row's request on each lane: a tile, not a scalar
    tok = tl.load(indices_ptr + row * indices_stride0 + cols)
    t0 = tl.where(tok >= 0, tok, 0)
    block = t0 // BLOCK_SIZE
    offset = t0 - block * BLOCK_SIZE
    in_table = (tok >= 0) & (block < max_blocks)
    req_ok = (req >= 0) & (req < num_reqs)
    row_base = table_ptr + tl.where(req_ok, req, 0) * table_stride0
    if HAS_PREFILL:
        prefill_req_id = tl.load(prefill_req_ptr + row)
        is_prefill = prefill_req_id >= 0  # a scalar condition loaded from memory, as vLLM's
        base = tl.load(row_base + block, mask=in_table & req_ok & ~is_prefill, other=0)
        prefill_ok = is_prefill & (prefill_req_id < num_starts)
        start = tl.load(prefill_starts_ptr + tl.where(prefill_ok, prefill_req_id, 0), mask=prefill_ok, other=0)
        value = tl.where(is_prefill, start + t0, base * BLOCK_SIZE + offset)
        valid = in_table & tl.where(is_prefill, prefill_ok, req_ok)
    else:
        valid = in_table & req_ok
        base = tl.load(row_base + block, mask=valid, other=0)
        value = base * BLOCK_SIZE + offset
    tl.store(out_ptr + row * out_stride0 + cols, tl.where(valid, value, -1))
    if COUNT_VALID:
        tl.atomic_add(counts_ptr + row, tl.sum(valid.to(tl.int32), axis=0))


def convert(
    req_id,
    block_table,
    token_indices,
    BLOCK_SIZE=64,
    NUM_TOPK_TOKENS=2048,
    BLOCK_N=128,
    HAS_PREFILL_WORKSPACE=False,
    prefill_workspace_request_ids=None,
    prefill_workspace_starts=None,
    return_valid_counts=False,
):
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
    )
    rows, k = token_indices.shape
    out = torch.empty_like(token_indices)
    counts = torch.zeros(rows, dtype=torch.int32, device=token_indices.device)
    table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    indices = token_indices if token_indices.stride(1) == 1 else token_indices.contiguous()
    if rows and k:
        has_prefill = bool(HAS_PREFILL_WORKSPACE)
        _convert_kernel[(rows, k // BLOCK_N)](
            req_id,
            table,
            indices,
            out,
            counts,
            prefill_workspace_request_ids if has_prefill else req_id,
            prefill_workspace_starts if has_prefill else req_id,
            table.shape[0],
            prefill_workspace_starts.shape[0] if has_prefill else 0,
            table.shape[1],
            table.stride(0),
            indices.stride(0),
            out.stride(0),
            BLOCK_SIZE=BLOCK_SIZE,
            BLOCK_N=BLOCK_N,
            HAS_PREFILL=has_prefill,
            COUNT_VALID=bool(return_valid_counts),
        )
    return (out, counts) if return_valid_counts else out
