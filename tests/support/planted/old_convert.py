"""A convert with the SPEC section 3 signature and neither section 7 option (no BLOCK_STRIDE_ROWS,
no COMPACT_TO_FRONT): the harness must detect that from the signature and never pass them."""

from mlafuzz.kernels.torch_impl import convert_torch


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


def shuffled_compact(
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
    *,
    COMPACT_TO_FRONT=False,
):
    """A correct convert whose compacted prefix comes in a new order on every call (the contract
    leaves it unspecified, as atomics would): never a finding, never nondeterminism."""
    import torch

    res = convert_torch(
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
        return_valid_counts=True,
        COMPACT_TO_FRONT=COMPACT_TO_FRONT,
    )
    out, counts = res
    if COMPACT_TO_FRONT:
        out = out.clone()
        for i, c in enumerate(counts.tolist()):  # the global RNG on purpose: a new order each call
            out[i, :c] = out[i, :c][torch.randperm(c)]
    return (out, counts) if return_valid_counts else out
