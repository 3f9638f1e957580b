"""Planted heap damage that ends in an exception: a convert that launches its kernel on a req_id
longer than token_indices (the error input ``length_mismatch``), "corrupts" its process, and
then raises out of the launch, as vLLM's DCP filter did under Triton's interpreter (its stores
past its own ``out`` reached the interpreter's objects, and the launch raised InterpreterError).
The call raised, so it looks refused; the process is damaged all the same and dies on its *next*
call, whatever that call's inputs.

The damage is simulated, deterministically, as in heap_corrupting_convert.py: a flag in this module
(the worker process's state, as a corrupted heap would be) set by the bad call and met by the next.
"""

import os

import torch
import triton
import triton.language as tl

from mlafuzz.kernels.torch_impl import convert_torch

DAMAGED = []  # non-empty once a bad call has "corrupted" this process


@triton.jit
def _rows_past_the_end(out_ptr, EXTRA_ROWS: tl.constexpr):
    tl.store(out_ptr, EXTRA_ROWS)
    tl.static_assert(EXTRA_ROWS == 0, "the programs past token_indices' rows ran")


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
    if DAMAGED:
        os.abort()  # the heap damage of an earlier call surfaces now
    out = convert_torch(
        req_id[: token_indices.shape[0]],
        block_table,
        token_indices,
        BLOCK_SIZE=BLOCK_SIZE,
        NUM_TOPK_TOKENS=NUM_TOPK_TOKENS,
        BLOCK_N=BLOCK_N,
        HAS_PREFILL_WORKSPACE=HAS_PREFILL_WORKSPACE,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
        return_valid_counts=return_valid_counts,
    )
    extra = req_id.shape[0] - token_indices.shape[0]
    if extra > 0:  # no length check: the launch runs the extra rows' programs, past the end
        DAMAGED.append(True)
        # Into a buffer of its own, as vLLM's stores went past the ``out`` it allocated: no guard
        # or input check of the harness can see them.
        _rows_past_the_end[(1,)](torch.empty(1, dtype=torch.int32), EXTRA_ROWS=extra)
    return out
