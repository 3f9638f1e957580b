"""Our CUDA nvfp4_ds_mla upconvert gather (kernels/csrc/nvfp4_device.cuh), with vLLM 0.34.0's
signature ``cp_gather_and_upconvert_nvfp4_kv_cache(src_cache, dst, block_table, workspace_starts,
batch_size, seq_starts=None)``.

It lives in the one extension of ours (kernels/cuda_ext.py builds it: the fp8 gather, the writer
and this gather share one .so) as ``torch.ops.mlafuzz_fp8_ds_mla.nvfp4_gather``. The e2m1 decode
is arithmetic on the bits, with no SM100 instruction, so it runs on Hopper (the H200) as on
Blackwell, where vLLM's own builds only for SM100.
"""

from __future__ import annotations

import torch

from mlafuzz.kernels import cuda_ext
from mlafuzz.kernels.checks import check_gather_args
from mlafuzz.oracles.formats.table import get

__all__ = ["gather", "gather_impl"]

_RECORD_BYTES = get("nvfp4_ds_mla").record_bytes


def gather_impl(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
    *,
    force_scalar: bool = False,
) -> None:
    """``gather`` with the scalar kernel selectable (tests): byte loads, any alignment."""
    # The extension's own helpers: the same CUDA check, byte view and loading as its fp8 gather.
    cuda_ext._require_cuda("src_cache", src_cache)
    # The host checks in Python first, as cuda_ext.gather_impl does (see its note on TORCH_CHECK).
    check_gather_args(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, record_bytes=_RECORD_BYTES)
    cuda_ext._ops().nvfp4_gather(
        cuda_ext._as_bytes(src_cache),
        dst,
        block_table,
        workspace_starts,
        int(batch_size),
        seq_starts,
        bool(force_scalar),
    )


def gather(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    """SPEC 11.2: dst[ws[b] + j] = the upconverted record at position seq_starts[b] + j of request
    b; the last request's rows run to dst.size(0). Host-side checks only (dtypes, shapes, devices,
    lengths), as vLLM's; the device-side preconditions of SPEC 4 are the caller's."""
    gather_impl(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
