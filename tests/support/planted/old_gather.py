"""The pre-#48642 gather signature: seq_lens, no seq_starts (a capability the harness must detect)."""

from mlafuzz.kernels.torch_impl import gather_torch


def gather(src_cache, dst, block_table, seq_lens, workspace_starts, batch_size):
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, None)
