"""Planted bugs of SPEC 8's views: kernels that assume their inputs are contiguous.

Each reads a tensor through the strides a fresh contiguous tensor of its shape would have, from
the start of its storage (what a raw-pointer kernel that ignores strides and storage offsets does),
then runs the torch implementation on what it read.
"""

import torch

from mlafuzz.kernels.torch_impl import convert_torch, gather_torch, writer_torch


def _as_contiguous(t):
    """t's shape read with contiguous strides from where its data pointer is (ignores strides)."""
    strides, acc = [], 1
    for size in reversed(t.shape):
        strides.append(acc)
        acc *= size
    return torch.as_strided(t, t.shape, tuple(reversed(strides)), t.storage_offset())


def _from_storage_start(t):
    """t's shape and strides read from the start of its storage (ignores the storage offset)."""
    return torch.as_strided(t, t.shape, t.stride(), 0)


def gather_contiguous_table(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    gather_torch(src_cache, dst, _as_contiguous(block_table), workspace_starts, batch_size, seq_starts)


def convert_contiguous_table(req_id, block_table, token_indices, **kwargs):
    return convert_torch(req_id, _as_contiguous(block_table), token_indices, **kwargs)


def convert_indices_from_row_0(req_id, block_table, token_indices, **kwargs):
    return convert_torch(req_id, block_table, _from_storage_start(token_indices), **kwargs)


def writer_contiguous_inputs(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None):
    writer_torch(_as_contiguous(kv_c), _as_contiguous(k_pe), kv_cache, slot_mapping, kv_cache_dtype, scale)


def gather_one_row_before(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    """Right, then one more row written just before dst (the workspace row above it)."""
    gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    if dst.shape[0]:
        torch.as_strided(dst, (1, dst.shape[1]), dst.stride(), dst.storage_offset() - dst.stride(0)).copy_(dst[:1])


def writer_ignores_base(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None):
    """Writes each record at slot - (the cache's first block with a nonzero byte) * bs: into the
    zero blocks below the case's own (a kernel that took block ids relative to the wrong base)."""
    bs = kv_cache.shape[1]
    base = int(torch.nonzero(kv_cache.reshape(kv_cache.shape[0], -1).any(1))[0])
    writer_torch(
        kv_c,
        k_pe,
        kv_cache,
        torch.where(slot_mapping >= 0, slot_mapping - base * bs, slot_mapping),
        kv_cache_dtype,
        scale,
    )
