"""Paged-cache block tables (SPEC.md section 1, "Paged cache"), shared by every op's materializer."""

from __future__ import annotations

import torch

from mlafuzz.generators.spec import Layout, Paging


def build_block_table(*, paging: Paging, seq_lens: list[int], gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """Block table int32 [R, M] and pool size for requests of these lengths.

    Entries past a request's last block are 0, as in vLLM's tests (SPEC: unspecified).
    """
    bs = paging.block_size
    need = [-(-n // bs) for n in seq_lens]
    shared = 0
    if paging.layout is Layout.SHARED_PREFIX and need and min(need) > 0 and len(need) > 1:
        shared = max(1, min(need) // 2)
    pool = shared + sum(n - shared for n in need) + paging.spare_blocks
    pool = max(pool, 1)
    if paging.layout is Layout.CONTIGUOUS:
        ids = torch.arange(pool, dtype=torch.int64)
    else:
        ids = torch.randperm(pool, generator=gen)
    width = max(max(need, default=0) + paging.extra_table_cols, 1)
    table = torch.zeros((len(need), width), dtype=torch.int32)
    prefix = ids[:shared]
    cursor = shared
    for r, n in enumerate(need):
        own = ids[cursor:cursor + n - shared]
        cursor += n - shared
        table[r, :n] = torch.cat([prefix, own])[:n].to(torch.int32)
    return table, pool
