"""Where a written token's record goes: the paged writer's slots (SPEC.md sections 2 and 11.3),
which name no record format.

Token i of a writer call with ``slot_mapping[i] = s >= 0`` puts its record at block ``s // bs``,
entry ``s % bs``; a negative slot writes nothing; a later token wins a repeated slot; a slot past
the cache is a precondition violation (ValueError), not a result. Every format's writer oracle
(fp8_ds_mla's ``oracles.codec``, nvfp4_ds_mla's ``formats.nvfp4_write``) checks its inputs and
places its records here, token by token or vectorized; what a record holds is the format's.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from mlafuzz.oracles.formats.table import Format

__all__ = ["writer_rows", "write_loop", "write"]


def writer_rows(kv_c: Tensor, k_pe: Tensor, n_tokens: int | None, *, fmt: Format) -> int:
    """How many tokens a writer call encodes: kv_c [T, NoPE width] and k_pe [T, RoPE width] of
    ``fmt`` (bf16 or fp16; TypeError/ValueError otherwise), of equal T when ``n_tokens`` is None,
    else at least ``n_tokens`` (the slot mapping's length) rows each."""
    for name, t, dim in (("kv_c", kv_c, fmt.nope_dim), ("k_pe", k_pe, fmt.rope_dim)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{name}.dtype={t.dtype}: expected bfloat16 or float16")
        if t.dim() != 2 or t.shape[1] != dim:
            raise ValueError(f"{name}.shape={tuple(t.shape)}: expected [T, {dim}]")
    rows = min(kv_c.shape[0], k_pe.shape[0])
    if n_tokens is None:
        if kv_c.shape[0] != k_pe.shape[0]:
            raise ValueError(f"kv_c.shape[0]={kv_c.shape[0]} != k_pe.shape[0]={k_pe.shape[0]}")
        return rows
    if n_tokens > rows:
        raise ValueError(f"len(slot_mapping)={n_tokens} > rows of kv_c/k_pe ({kv_c.shape[0]}, {k_pe.shape[0]})")
    return n_tokens


def _check_slots(slots: list[int], n_slots: int) -> None:
    bad = [s for s in slots if s >= n_slots]
    if bad:
        raise ValueError(f"slot_mapping has slots past the cache: {bad[:4]} >= num_blocks*bs={n_slots}")


def write_loop(
    *, cache: Tensor, slot_mapping: Tensor, kv_c: Tensor, k_pe: Tensor, fmt: Format, encode: Callable[..., Tensor]
) -> Tensor:
    """A CPU clone of ``cache`` (the format's checked uint8 view of kv_cache, [num_blocks, bs,
    record_bytes]) with token i's record ``encode(kv_c=kv_c[i : i + 1], k_pe=k_pe[i : i + 1])[0]``
    at its slot, token by token; ValueError for inputs ``writer_rows`` refuses or a slot past the
    cache, before any write."""
    out = cache.cpu().clone()
    slots = [int(s) for s in slot_mapping.reshape(-1).tolist()]
    writer_rows(kv_c, k_pe, len(slots), fmt=fmt)
    _check_slots(slots, out.shape[0] * out.shape[1])
    bs = out.shape[1]
    for i, slot in enumerate(slots):
        if slot >= 0:
            out[slot // bs, slot % bs] = encode(kv_c=kv_c[i : i + 1], k_pe=k_pe[i : i + 1])[0]
    return out


def write(
    *, cache: Tensor, slot_mapping: Tensor, kv_c: Tensor, k_pe: Tensor, fmt: Format, encode: Callable[..., Tensor]
) -> Tensor:
    """``write_loop`` vectorized on the cache's device, bit-identical to it: the tokens' records
    ``encode(kv_c=..., k_pe=...)`` made once (only when a token writes), a repeated slot resolved
    to the last token explicitly (index_put with duplicates is unordered on CUDA)."""
    out = cache.clone(memory_format=torch.contiguous_format)
    slots = slot_mapping.reshape(-1).to(device=out.device, dtype=torch.int64)
    n = writer_rows(kv_c, k_pe, int(slots.shape[0]), fmt=fmt)
    num_blocks, bs, width = out.shape
    if n and int(slots.max()) >= num_blocks * bs:
        _check_slots(slots.tolist(), num_blocks * bs)
    tok = torch.nonzero(slots >= 0).reshape(-1)
    if tok.numel() == 0:
        return out
    uniq, inverse = torch.unique(slots[tok], return_inverse=True)
    last = torch.full_like(uniq, -1).scatter_reduce(0, inverse, tok, reduce="amax")
    out.view(num_blocks * bs, width)[uniq] = encode(kv_c=kv_c[:n], k_pe=k_pe[:n]).to(out.device)[last]
    return out
