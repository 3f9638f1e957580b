"""Planted GPU fault: a gather that stores far outside dst (an illegal address, which leaves the
process's CUDA context unusable) on 3-request batches, and is correct otherwise."""

import triton
import triton.language as tl

from mlafuzz.kernels.torch_impl import gather_torch


@triton.jit
def _wild_store(ptr):
    tl.store(ptr + (1 << 40), 1)


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    if batch_size == 3:
        _wild_store[(1,)](dst)
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
