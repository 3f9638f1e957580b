"""Planted crash-prone error-input class: a gather whose host check takes the process down with
SIGSEGV when dst is not bf16 (vLLM's gather on the H200 image), and is correct otherwise."""

import os
import signal

import torch

from mlafuzz.kernels.torch_impl import gather_torch


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    if dst.dtype != torch.bfloat16:
        os.kill(os.getpid(), signal.SIGSEGV)
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
