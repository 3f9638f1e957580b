"""The nvfp4_ds_mla gathers over the paged cache (SPEC.md sections 4 and 11.2).

vLLM 0.34.0's ``cp_gather_and_upconvert_nvfp4_kv_cache(src_cache, dst, block_table,
workspace_starts, batch_size, seq_starts=None)`` is the fp8_ds_mla gather of section 4 with a
352-byte record and the exact reader of ``nvfp4_read``: request b owns dst rows
``[ws[b], ws[b+1])`` (the last one ``[ws[B-1], total)``), and ``dst[ws[b] + j]`` reads the record
at position ``seq_starts[b] + j`` of request b, slot ``block_table[b, p // bs] * bs + p % bs``.
Its FP8 staging sibling (vLLM's Triton context gather for FlashInfer) addresses the same way with
the staging reader (and no ``seq_starts`` in vLLM yet; the oracle takes it, None = zeros).

The addressing and its precondition classes are the fp8 gather oracle's (``oracles.gather``):
the vectorized versions reuse its ``row_records`` and every version judges its call with its
``addressing_violations``. The fp8 oracle itself is not parameterized by a record decoder: its
host tier (SPEC 9.3) is fp8-only (vLLM refuses nvfp4 with HiSparse) and its loop dequantizes
inline, so these gathers live beside it and share only the format-free parts.

Like ``oracles.gather``, each returns a new tensor of ``total`` rows (bf16 ``[total, 576]``, or
e4m3fn bytes uint8 ``[total, 576]`` for the staging reader) and raises ValueError naming the
violated classes when the call is not well defined.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mlafuzz.oracles.formats.addressing import addressing_violations, host_args, row_records
from mlafuzz.oracles.formats.nvfp4_read import ROW_DIM, dequant, dequant_loop, loose_mask, stage_fp8, stage_fp8_loop
from mlafuzz.oracles.formats.nvfp4_record import RECORD_BYTES, as_records

__all__ = ["gather_preconditions", "gather_loop", "gather", "gather_fp8_loop", "gather_fp8", "gather_loose"]


def _host_args(*, src_cache: Tensor, **call: Any) -> tuple[list[int], list[int], list[list[int]], int, int]:
    """Shape checks (the shared ones, on 352-byte records); (ws[:B], seq_starts[:B], table rows, bs, num_blocks)."""
    return host_args(cache=as_records(src_cache), record_bytes=RECORD_BYTES, **call)


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
    ws, ss, table, bs, num_blocks = _host_args(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    return addressing_violations(ws=ws, seq_starts=ss, table=table, block_size=bs, num_blocks=num_blocks, total=total)


def _require(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> tuple[list[int], list[int], list[list[int]], int]:
    """``_host_args`` for a well-defined call; ValueError naming the violated classes otherwise."""
    ws, ss, table, bs, num_blocks = _host_args(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    bad = addressing_violations(ws=ws, seq_starts=ss, table=table, block_size=bs, num_blocks=num_blocks, total=total)
    if bad:
        raise ValueError(f"gather preconditions violated: {bad} (workspace_starts={ws}, seq_starts={ss})")
    return ws, ss, table, bs


def _records_loop(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> Tensor:
    """The record each dst row reads, uint8 [total, 352], request by request and row by row."""
    ws, ss, table, bs = _require(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    cache = as_records(src_cache).cpu()
    rows: list[Tensor | None] = [None] * total
    for b in range(batch_size):
        end = ws[b + 1] if b + 1 < batch_size else total
        for j in range(end - ws[b]):
            p = ss[b] + j
            rows[ws[b] + j] = cache[table[b][p // bs], p % bs]
    if any(r is None for r in rows):  # cannot happen once the preconditions hold
        raise AssertionError("an nvfp4 gather row is owned by no request")
    return torch.stack(rows) if total else torch.empty(0, RECORD_BYTES, dtype=torch.uint8)  # type: ignore[arg-type]


def _records(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
) -> Tensor:
    """``_records_loop`` vectorized on the cache's device, through the fp8 oracle's ``row_records``."""
    _require(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    cache = as_records(src_cache)
    if total == 0:
        return torch.empty(0, RECORD_BYTES, dtype=torch.uint8, device=cache.device)
    block, entry = row_records(
        block_size=cache.shape[1],
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
        device=cache.device,
    )
    return cache[block, entry]


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
    records = _records_loop(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
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
    records = _records(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
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
    records = _records_loop(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
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
    records = _records(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
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
    records = _records(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )
    return loose_mask(records).reshape(-1, ROW_DIM)
