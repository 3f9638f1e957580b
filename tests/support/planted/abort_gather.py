"""Planted crash: a gather that aborts the process (like an illegal-address trap) on 3-request batches."""

import os

from mlafuzz.kernels.torch_impl import gather_torch


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    if batch_size == 3:
        os.abort()
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
