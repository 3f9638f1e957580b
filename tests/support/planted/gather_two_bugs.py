"""Planted: two bugs, so a run draws two buckets. seq_starts is ignored (every request read from
position 0: VALUE_MISMATCH), and NaN is swallowed to 0 (NAN_MISMATCH where the first bug is silent)."""

import torch

from mlafuzz.kernels.torch_impl import gather_torch


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, None)
    dst.masked_fill_(torch.isnan(dst), 0.0)
