"""Planted bug (the pre-#48642 gather): every request is read from position 0, seq_starts ignored."""

from mlafuzz.kernels.torch_impl import gather_torch


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, None)
