"""Planted bugs of SPEC 8's huge caches: record byte offsets computed in 32 bits.

A CUDA kernel that computes ``slot * 656`` in int32 wraps past 2**31 bytes and addresses memory
before the cache. Here the wrapped offset indexes the cache's bytes the way Python indexes (a
negative one from the end): the wrong record is read or written, as on the GPU, minus the crash.
"""

import torch

from mlafuzz.kernels.torch_impl import dequant_records_torch, encode_records_torch
from mlafuzz.oracles.gather import row_records

RECORD = 656


def _int32(offsets):
    return ((offsets + 2**31) % 2**32) - 2**31


def gather_int32_offsets(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    cache = src_cache.view(torch.uint8)
    bs, total = cache.shape[1], dst.shape[0]
    block, entry = row_records(
        block_size=bs,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
        device=dst.device,
    )
    start = _int32((block * bs + entry) * RECORD)
    records = cache.reshape(-1)[start.unsqueeze(1) + torch.arange(RECORD, device=dst.device)]
    dst.copy_(dequant_records_torch(records))


def writer_int32_offsets(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None):
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    records = encode_records_torch(kv_c=kv_c[: slot_mapping.shape[0]][keep], k_pe=k_pe[: slot_mapping.shape[0]][keep])
    start = _int32(slots * RECORD)
    kv_cache.view(torch.uint8).reshape(-1)[start.unsqueeze(1) + torch.arange(RECORD, device=slots.device)] = records


def gather_int16_block_ids(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    """Block ids read through 16 bits (a table assumed to hold small ids): wrong blocks past 32767."""
    from mlafuzz.kernels.torch_impl import gather_torch

    gather_torch(
        src_cache, dst, block_table.to(torch.int16).to(torch.int32) & 0x7FFF, workspace_starts, batch_size, seq_starts
    )
