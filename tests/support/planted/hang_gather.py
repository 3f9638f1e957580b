"""Planted hang: a gather that never returns on 2-request batches."""

import time

from mlafuzz.kernels.torch_impl import gather_torch


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    if batch_size == 2:
        while True:
            time.sleep(1)
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
