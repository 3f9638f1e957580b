"""Oracles for the DCP rank filtering of the convert (SPEC.md section 9.4).

With decode-context parallelism of world size D and interleave I, the KV cache
of a request is dealt out to the ranks in groups of I consecutive tokens:
token t (a request-local position) lives on rank ``owner(t) = (t // I) % D``,
where it is position ``local(t) = (t // (D*I)) * I + t % I`` of that rank's own
share, paged by that rank's block table.

``dcp_filter`` (vLLM's ``triton_filter_and_convert_dcp_index``), seen from
rank ``rank``: column c of row i, with ``tok = token_indices[i, c]`` and
``req = req_id[i]``, is invalid when ``tok < 0``, when another rank owns it, or
when ``blk = local(tok) // bs`` is not in ``[0, M)``; otherwise its value is
``block_table[req, blk] * bs + local(tok) % bs`` (int32, wrapping like the
kernel's arithmetic). ``out = -1`` where invalid; ``valid_counts[i]`` = valid
columns. With ``compact`` the valid values are packed at the row's front in an
unspecified order, -1 after (the oracle gives column order; the harness
compares such rows as multisets, oracles/convert.py ``rows_as_sets_equal``).
``block_stride`` (vLLM's ``BLOCK_STRIDE_ROWS``, from 0.29.0; None: the block size)
multiplies the table entry instead of ``bs``: blocks padded to a row stride, the
bounds rule unchanged, the offset still ``local(tok) % bs``.

Which rows are compacted (``filter_compacts``, from vLLM's releases 0.27.0-0.34.0):
with ``dcp_size > 1`` exactly those the caller asks for (``compact_valid_to_front``,
counted or not). With ``dcp_size == 1`` vLLM's function hands the call to the plain
convert and drops ``compact_valid_to_front`` (every release): a row is then what the
plain convert makes of it, in place unless it is counted and the revision's
``convert_counted`` rule is ``compact`` (vLLM 0.30.0 on: the plain convert packs
every counted row).

``dcp_peer_slots`` (vLLM's ``convert_global_indices_to_dcp_peer_slots``): the
slot of every valid token in a rank-major view of all ranks' caches, each rank
``blocks_per_peer`` blocks of ``bs`` rows: with ``lb = local(tok) // bs`` and
``blk = block_table[req, lb]``, the value is ``(owner(tok) * blocks_per_peer +
blk) * bs + local(tok) % bs``, valid only when ``tok >= 0``, ``0 <= req < R``,
``0 <= lb < M`` and ``0 <= blk < blocks_per_peer`` (the table holds each
owner's block ids in its own cache). The host check that ``D *
blocks_per_peer * bs`` fits int32 makes every valid value fit; the oracle
computes in int64 all the same. No compaction.

Readings chosen where the sources are silent: a row whose req lies outside
``[0, R)`` is all -1 in both (the peer variant says so; for the filter it is an
input vLLM does not check, so the harness never draws one as valid input). D
== 1 is the plain convert of section 3 (owner 0, local = tok).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mlafuzz.oracles.convert import _compact, _wrap_int32_tensor, wrap_int32

__all__ = [
    "dcp_filter",
    "dcp_filter_loop",
    "dcp_peer_slots",
    "dcp_peer_slots_loop",
    "filter_compacts",
    "owner_local",
]


def filter_compacts(
    *, dcp_size: int, compact_valid_to_front: bool, return_valid_counts: bool, convert_counted: str
) -> bool:
    """Whether the filter packs its rows to the front (the module docstring): the caller's
    ``compact_valid_to_front`` when D > 1; at D == 1 the plain convert's rule, ``convert_counted``
    (``in_place`` | ``compact``) for a counted row, in place for an uncounted one."""
    if dcp_size == 1:
        return bool(return_valid_counts) and convert_counted == "compact"
    return bool(compact_valid_to_front)


def owner_local(tok: int, *, dcp_size: int, interleave: int) -> tuple[int, int]:
    """(owning rank, local index) of a non-negative token position."""
    return (tok // interleave) % dcp_size, (tok // (dcp_size * interleave)) * interleave + tok % interleave


def _loop(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    dcp_size: int,
    interleave: int,
    value,
    compact: bool = False,
) -> tuple[Tensor, Tensor]:
    """Cell by cell: ``value(table row, owner, local)`` gives the slot or None (invalid);
    ``compact``: each row's valid values first, in column order, then -1."""
    table, n_req = block_table.tolist(), block_table.shape[0]
    out, counts = [], []
    for req, row in zip(req_id.tolist(), token_indices.tolist()):
        vals = []
        for tok in row:
            v = None
            if tok >= 0 and 0 <= req < n_req:
                owner, local = owner_local(tok, dcp_size=dcp_size, interleave=interleave)
                v = value(table[req], owner, local)
            vals.append(v)
        kept = [v for v in vals if v is not None]  # a valid value that wrapped to -1 still counts
        out.append(kept + [-1] * (len(vals) - len(kept)) if compact else [-1 if v is None else v for v in vals])
        counts.append(len(kept))
    n, k = token_indices.shape
    return torch.tensor(out, dtype=torch.int32).reshape(n, k), torch.tensor(counts, dtype=torch.int32).reshape(n)


def dcp_filter_loop(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    dcp_size: int,
    dcp_rank: int,
    interleave: int,
    compact: bool,
    block_stride: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The filter of the module docstring, in Python ints. (out int32 [N, K], valid_counts [N])."""
    m = block_table.shape[1]
    stride = block_size if block_stride is None else block_stride

    def value(row: list[int], owner: int, local: int) -> int | None:
        blk = local // block_size
        if owner != dcp_rank or not 0 <= blk < m:
            return None
        return wrap_int32(row[blk] * stride + local % block_size)

    return _loop(
        req_id=req_id,
        block_table=block_table,
        token_indices=token_indices,
        block_size=block_size,
        dcp_size=dcp_size,
        interleave=interleave,
        value=value,
        compact=compact,
    )


def dcp_peer_slots_loop(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    dcp_size: int,
    interleave: int,
    blocks_per_peer: int,
) -> tuple[Tensor, Tensor]:
    """The peer-slot map of the module docstring, in Python ints."""
    m = block_table.shape[1]

    def value(row: list[int], owner: int, local: int) -> int | None:
        lb = local // block_size
        if not 0 <= lb < m or not 0 <= row[lb] < blocks_per_peer:
            return None
        return wrap_int32((owner * blocks_per_peer + row[lb]) * block_size + local % block_size)

    return _loop(
        req_id=req_id,
        block_table=block_table,
        token_indices=token_indices,
        block_size=block_size,
        dcp_size=dcp_size,
        interleave=interleave,
        value=value,
    )


# Past every int32: the entry a read outside the table gives (the table holds int32 block ids).
_OUTSIDE = -(1 << 40)


def _parts(req_id: Tensor, block_table: Tensor, token_indices: Tensor, block_size: int, dcp_size: int, interleave: int):
    """Vectorized, in int64: (owner, local, the table entry at [req, local // bs], or ``_OUTSIDE``
    where that is not in the table). A negative token has a negative local index (floor division),
    so it reads outside too. Whole-tensor ops, few (each is a launch on a GPU): the table gets a
    row and a column of ``_OUTSIDE`` after it, and every read outside lands there (index -1 too)."""
    dev = token_indices.device
    r, m = block_table.shape
    tok = token_indices.to(torch.int64)
    owner = torch.div(tok, interleave, rounding_mode="floor") % dcp_size
    local = torch.add(tok % interleave, torch.div(tok, dcp_size * interleave, rounding_mode="floor"), alpha=interleave)
    lb = torch.div(local, block_size, rounding_mode="floor")
    padded = torch.nn.functional.pad(block_table.to(dev, torch.int64), (0, 1, 0, 1), value=_OUTSIDE)
    req = req_id.to(dev, torch.int64).clamp(-1, r)[:, None]
    return owner, local, padded[req, lb.clamp(-1, m)]


def dcp_filter(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    dcp_size: int,
    dcp_rank: int,
    interleave: int,
    compact: bool,
    block_stride: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Vectorized ``dcp_filter_loop``, on token_indices' device; bit-identical to it."""
    owner, local, entry = _parts(req_id, block_table, token_indices, block_size, dcp_size, interleave)
    valid = (entry != _OUTSIDE) & (owner == dcp_rank)
    stride = block_size if block_stride is None else block_stride
    value = _wrap_int32_tensor(torch.add(local % block_size, entry, alpha=stride))
    out = torch.where(valid, value, -1)
    if compact:
        out = _compact(out, valid)
    return out.to(torch.int32), valid.sum(dim=1, dtype=torch.int32)


def dcp_peer_slots(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    dcp_size: int,
    interleave: int,
    blocks_per_peer: int,
) -> tuple[Tensor, Tensor]:
    """Vectorized ``dcp_peer_slots_loop``, on token_indices' device; bit-identical to it."""
    owner, local, entry = _parts(req_id, block_table, token_indices, block_size, dcp_size, interleave)
    valid = (entry >= 0) & (entry < blocks_per_peer)  # _OUTSIDE is negative
    block = torch.add(entry, owner, alpha=blocks_per_peer)  # owner * blocks_per_peer + entry
    value = _wrap_int32_tensor(torch.add(local % block_size, block, alpha=block_size))
    out = torch.where(valid, value, -1)
    return out.to(torch.int32), valid.sum(dim=1, dtype=torch.int32)
