"""Planted heap damage: a convert that accepts a req_id longer than token_indices (the error input
``length_mismatch``, which vLLM's DCP filter reads and writes out of bounds on) and then, like a
process whose heap it corrupted, dies on its *next* call, whatever that call's inputs.

The damage is simulated, deterministically: a flag in this module (the worker process's state,
as a corrupted heap would be) set by the bad call and met by the next. A worker that keeps
running after the bad input charges the crash to a later valid case, whose bundle replays clean.
"""

import os

from mlafuzz.kernels.torch_impl import convert_torch

DAMAGED = []  # non-empty once a bad call has "corrupted" this process


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
    if req_id.shape[0] != token_indices.shape[0]:
        DAMAGED.append(True)
        req_id = req_id[: token_indices.shape[0]]  # runs on, past the end of what it was given
    return convert_torch(
        req_id,
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
