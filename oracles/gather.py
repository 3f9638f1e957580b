"""Oracle for `gather`: FP8 gather and upconvert with seq_starts (SPEC.md section 4).

Request b (b < batch_size) owns dst rows [ws[b], ws[b+1]), the last request
[ws[B-1], total); dst[ws[b] + j] = dequant(record at position
seq_starts[b] + j of request b), position p living at slot
block_table[b, p // bs] * bs + p % bs, bs = src_cache.shape[1].

The oracle returns dst as a new bf16 tensor [total, 576] instead of writing
one in place. It only defines dst when the preconditions hold, and raises
ValueError naming the violated classes otherwise; `gather_preconditions`
lists them without raising, in this fixed vocabulary:

- "ws0_nonzero": ws[0] != 0 (rows [0, ws[0]) would be owned by nobody). Also
  used for batch_size == 0 with total > 0: every row is unowned.
- "ws_decreasing": ws[b+1] < ws[b] for some b < B-1.
- "ws_past_total": ws[B-1] > total.
- "block_index_past_table": (seq_starts[b] + len_b - 1) // bs >= M for a
  request with len_b > 0.
- "block_id_past_cache": a block id the request reads is outside
  [0, num_blocks) (negative ids included: they read before the cache).
- "negative_seq_start": seq_starts[b] < 0 for a request with len_b > 0.

Readings: only requests with rows (len_b > 0) are checked for the table and
cache classes, since an empty request reads nothing; lengths are computed
only where ws is consistent, so a decreasing ws is reported once as
"ws_decreasing" and not again through negative lengths. Malformed shapes
(ws, seq_starts or block_table shorter than batch_size, a record size other
than 656, total < 0) are argument errors, raised as ValueError by both
functions. workspace_starts may have batch_size + 1 entries: the last is
ignored.

The host tier (SPEC 9.3, vLLM's HiSparse), given as ``host_cache``,
``host_row_ids`` and ``device_row_ids`` together or not at all. In our words,
from SPEC 9.3 and vLLM's callers (the staging plan in vllm/v1/hisparse and
the sparse-MLA index group that calls the gather on a side stream):

- Position p of request b still names a source slot through the table,
  s = block_table[b, p // bs] * bs + p % bs; with the host tier that slot is
  an index into the two maps, no longer a place in the device cache.
- device_row_ids[s] >= 0: the record is the device cache's row d =
  device_row_ids[s], i.e. block d // bs, entry d % bs. Row 0 is a row like
  any other (vLLM's planner never maps to its null block 0, but the gather
  itself gives 0 no special meaning). Any negative value (not only -1) means
  "not on the device".
- Otherwise the record is host_cache[host_row_ids[s]] (host_cache is a
  pinned CPU uint8 [rows, 656], row-major, no blocks). vLLM's planner fills
  the host map with -1 for the padding rows of its staging blocks; such a
  slot must never be read from the host: a host row outside [0, rows) on a
  slot a row reads is a precondition violation, like a block id past the
  cache, and nothing is defined for it.
- The maps are int32 of equal size (vLLM passes them shaped [1, n]: only
  their element count and order matter); a slot read must be < that size.
- Dequantization is section 2's, whichever tier the record comes from.
- What vLLM checks on the host for these arguments (dtype, device, pinning)
  could not be read from its stored source at 2a814fefa0e5 (the index holds
  older revisions of cache_kernels.cu only), so none of it is part of the
  op's contract; our implementations declare what they refuse.

Host-tier preconditions, in the same vocabulary (checked for the slots rows
actually read, and only when the table classes above hold, since the slots
are undefined otherwise):

- "slot_past_row_map": a slot read is >= the maps' size.
- "device_row_past_cache": device_row_ids[s] >= num_blocks * bs.
- "host_row_past_cache": device_row_ids[s] < 0 and host_row_ids[s] outside
  [0, rows) (the -1 of a padding row included).

Shape errors (only some of the three given, maps of different sizes, a
host_cache not [rows, 656]) are argument errors: ValueError.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor

from mlafuzz.oracles.codec import RECORD_BYTES, as_record_bytes, dequant_records, dequant_records_loop
from mlafuzz.oracles.formats.addressing import PRECONDITION_CLASSES, GatherCall, addressing_violations, row_records

__all__ = [
    "PRECONDITION_CLASSES",
    "addressing_violations",
    "gather_preconditions",
    "gather_loop",
    "gather",
    "host_tier",
    "row_records",
]


def host_tier(
    host_cache: Tensor | None, host_row_ids: Tensor | None, device_row_ids: Tensor | None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """(host records uint8 [rows, 656], host map int64 [n], device map int64 [n]) on the CPU, or
    None without a host tier; ValueError for arguments given in part or of the wrong shape."""
    given = [x is not None for x in (host_cache, host_row_ids, device_row_ids)]
    if not any(given):
        return None
    if not all(given):
        raise ValueError(
            "host_cache, host_row_ids and device_row_ids are given together or not at all "
            f"(given: {[n for n, g in zip(('host_cache', 'host_row_ids', 'device_row_ids'), given) if g]})"
        )
    assert host_cache is not None and host_row_ids is not None and device_row_ids is not None
    host = as_record_bytes(host_cache).cpu()
    if host.dim() != 2 or host.shape[1] != RECORD_BYTES:
        raise ValueError(f"host_cache.shape={tuple(host.shape)}: expected [rows, 656]")
    if host_row_ids.numel() != device_row_ids.numel():
        raise ValueError(f"host_row_ids has {host_row_ids.numel()} entries != device_row_ids' {device_row_ids.numel()}")
    return host, host_row_ids.reshape(-1).cpu().to(torch.int64), device_row_ids.reshape(-1).cpu().to(torch.int64)


def _tier_violations(slots: Tensor, tier: tuple[Tensor, Tensor, Tensor], num_slots: int) -> list[str]:
    """The host-tier classes of the slots read (int64 [n], CPU)."""
    host, hmap, dmap = tier
    found = []
    inside = slots < hmap.numel()
    if not bool(inside.all()):
        found.append("slot_past_row_map")
    s = slots[inside]
    d, h = dmap[s], hmap[s]
    if bool((d >= num_slots).any()):
        found.append("device_row_past_cache")
    from_host = d < 0
    if bool((from_host & ((h < 0) | (h >= host.shape[0]))).any()):
        found.append("host_row_past_cache")
    return found


# A call's first six arguments as one shape-checked call on 656-byte records (host_tier takes the rest).
_call = functools.partial(GatherCall, as_records=as_record_bytes, record_bytes=RECORD_BYTES)


def _violations(call: GatherCall, tier: tuple[Tensor, Tensor, Tensor] | None) -> list[str]:
    """The violated classes of a shape-checked call (module docstring), in vocabulary order."""
    found = call.violations()
    if tier is None or found or call.total == 0:
        return found
    block, entry = call.row_records(torch.device("cpu"))
    return _tier_violations(block * call.block_size + entry, tier, call.num_blocks * call.block_size)


def gather_preconditions(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
    host_cache: Tensor | None = None,
    host_row_ids: Tensor | None = None,
    device_row_ids: Tensor | None = None,
) -> list[str]:
    """The violated precondition classes (module docstring), in vocabulary
    order; [] when the call is well defined."""
    tier = host_tier(host_cache, host_row_ids, device_row_ids)
    return _violations(_call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total), tier)


def _tier_record(call: GatherCall, tier: tuple[Tensor, Tensor, Tensor]) -> Callable[[int, int], Tensor]:
    """The record at (block, entry) with the host tier: its slot's device row when the device map
    has one (>= 0), else its host row."""
    host, hmap, dmap = tier
    cache, bs = call.cache.cpu(), call.block_size

    def record(block: int, entry: int) -> Tensor:
        slot = block * bs + entry
        d = int(dmap[slot])
        return cache[d // bs, d % bs] if d >= 0 else host[int(hmap[slot])]

    return record


def gather_loop(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
    host_cache: Tensor | None = None,
    host_row_ids: Tensor | None = None,
    device_row_ids: Tensor | None = None,
) -> Tensor:
    """SPEC section 4 (and 9.3 with the host tier), request by request and row by
    row, dequantizing the records with `dequant_records_loop`. Returns bf16
    [total, 576] on the CPU."""
    tier = host_tier(host_cache, host_row_ids, device_row_ids)
    call = _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total)
    call.require(_violations(call, tier))
    return dequant_records_loop(call.records_loop(None if tier is None else _tier_record(call, tier)))


def gather(
    *,
    src_cache: Tensor,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
    host_cache: Tensor | None = None,
    host_row_ids: Tensor | None = None,
    device_row_ids: Tensor | None = None,
) -> Tensor:
    """Vectorized SPEC section 4 (and 9.3) on src_cache's device; bit-identical
    to `gather_loop`. Each dst row finds its owner with a right-sided
    searchsorted over ws[:B] (``row_records``: with empty requests, the last
    request whose start is <= the row is the one that owns it); with the host
    tier, each row's slot then picks its tier with one `where`."""
    tier = host_tier(host_cache, host_row_ids, device_row_ids)
    call = _call(src_cache, block_table, workspace_starts, batch_size, seq_starts, total)
    call.require(_violations(call, tier))
    if tier is None or total == 0:
        return dequant_records(call.records())
    cache, dev, bs = call.cache, call.cache.device, call.block_size
    block, entry = call.row_records(dev)
    host, hmap, dmap = (t.to(dev) for t in tier)
    slot = block * bs + entry
    d, h = dmap[slot], hmap[slot]
    on_device = d >= 0
    d = torch.where(on_device, d, 0)  # a host row's d is never used; 0 keeps the index legal
    h = torch.where(on_device, 0, h)
    if host.shape[0] == 0:  # every slot on the device: a row to index, never selected
        host = torch.zeros(1, RECORD_BYTES, dtype=torch.uint8, device=dev)
    records = torch.where(on_device[:, None], cache[d // bs, d % bs], host[h])
    return dequant_records(records)
