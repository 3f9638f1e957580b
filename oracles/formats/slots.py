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

__all__ = ["writer_rows", "place_loop", "place"]


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


def place_loop(cache: Tensor, slots: list[int], record: Callable[[int], Tensor]) -> Tensor:
    """``cache`` ([num_blocks, bs, record_bytes], written in place and returned) with token i's
    ``record(i)`` at its slot, token by token; ValueError for a slot past the cache, before any
    write."""
    _check_slots(slots, cache.shape[0] * cache.shape[1])
    bs = cache.shape[1]
    for i, slot in enumerate(slots):
        if slot >= 0:
            cache[slot // bs, slot % bs] = record(i)
    return cache


def place(cache: Tensor, slots: Tensor, records: Callable[[], Tensor]) -> Tensor:
    """``place_loop`` vectorized on the cache's device (``slots`` int64 there, ``records()`` the
    tokens' records, made only when a token writes); a repeated slot is resolved to the last token
    explicitly (index_put with duplicates is unordered on CUDA)."""
    num_blocks, bs, width = cache.shape
    if slots.numel() and int(slots.max()) >= num_blocks * bs:
        _check_slots(slots.tolist(), num_blocks * bs)
    tok = torch.nonzero(slots >= 0).reshape(-1)
    if tok.numel() == 0:
        return cache
    uniq, inverse = torch.unique(slots[tok], return_inverse=True)
    last = torch.full_like(uniq, -1).scatter_reduce(0, inverse, tok, reduce="amax")
    cache.view(num_blocks * bs, width)[uniq] = records()[last]
    return cache
