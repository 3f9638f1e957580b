"""The nvfp4_ds_mla gathers over the paged cache (SPEC.md sections 4 and 11.2).

vLLM 0.34.0's ``cp_gather_and_upconvert_nvfp4_kv_cache(src_cache, dst, block_table,
workspace_starts, batch_size, seq_starts=None)`` is the fp8_ds_mla gather of section 4 with a
352-byte record and the exact reader of ``nvfp4_read``: request b owns dst rows
``[ws[b], ws[b+1])`` (the last one ``[ws[B-1], total)``), and ``dst[ws[b] + j]`` reads the record
at position ``seq_starts[b] + j`` of request b, slot ``block_table[b, p // bs] * bs + p % bs``.
Its FP8 staging sibling (vLLM's Triton context gather for FlashInfer) addresses the same way with
the staging reader (and no ``seq_starts`` in vLLM yet; the oracle takes it, None = zeros).

The addressing and its precondition classes are every format's (``addressing.GatherCall``, which
``oracles.gather`` uses too): each function below views its call once (``_call``) and applies one
reader to the records the call reads, found row by row (``records_loop``) or vectorized
(``records``). Only the fp8 oracle has a host tier (SPEC 9.3; vLLM refuses nvfp4 with HiSparse).

Like ``oracles.gather``, each returns a new tensor of ``total`` rows (bf16 ``[total, 576]``, or
e4m3fn bytes uint8 ``[total, 576]`` for the staging reader) and raises ValueError naming the
violated classes when the call is not well defined.
"""

from __future__ import annotations

import functools

from torch import Tensor

from mlafuzz.oracles.formats.addressing import GatherCall
from mlafuzz.oracles.formats.nvfp4_read import ROW_DIM, dequant, dequant_loop, loose_mask, stage_fp8, stage_fp8_loop
from mlafuzz.oracles.formats.nvfp4_record import RECORD_BYTES, as_records

__all__ = ["gather_preconditions", "gather_loop", "gather", "gather_fp8_loop", "gather_fp8", "gather_loose"]

# A call's arguments as one shape-checked call on 352-byte records.
_call = functools.partial(GatherCall, as_records=as_records, record_bytes=RECORD_BYTES)


def gather_preconditions(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> list[str]:
    """The violated precondition classes (``oracles.gather``'s vocabulary); [] when well defined."""
    return _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total).violations()


def gather_loop(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> Tensor:
    """Exact reader, loop addressing and loop dequant: bf16 [total, 576] on the CPU."""
    records = _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total).require().records_loop()
    return dequant_loop(records).reshape(-1, ROW_DIM)


def gather(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> Tensor:
    """Exact reader, vectorized: bf16 [total, 576] on the cache's device; equals ``gather_loop``."""
    records = _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total).require().records()
    return dequant(records).reshape(-1, ROW_DIM)


def gather_fp8_loop(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
    inv_scale: float,
) -> Tensor:
    """FP8 staging reader, loop version: e4m3fn bytes uint8 [total, 576] on the CPU."""
    records = _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total).require().records_loop()
    return stage_fp8_loop(records, inv_scale=inv_scale).reshape(-1, ROW_DIM)


def gather_fp8(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
    inv_scale: float,
) -> Tensor:
    """FP8 staging reader, vectorized; equals ``gather_fp8_loop``."""
    records = _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total).require().records()
    return stage_fp8(records, inv_scale=inv_scale).reshape(-1, ROW_DIM)


def gather_loose(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> Tensor:
    """bool [total, 576] on the cache's device: the elements ``gather`` reads through a scale
    byte no writer makes (``nvfp4_read.loose_mask``), where only NaN-ness and sign are contract."""
    records = _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total).require().records()
    return loose_mask(records).reshape(-1, ROW_DIM)
