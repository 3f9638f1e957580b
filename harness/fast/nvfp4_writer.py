"""The fast path's check of nvfp4_writer (the op row's ``fast``): the cache after the call against
the vectorized oracle's records (oracles/formats/nvfp4_write.py), computed on the case's device
with whole-tensor torch ops and compared there, the verdict written into the board with no sync.

No Triton kernel of its own beside ``slot_owners`` (harness/fast/writer.py: the slot -> token map,
one fill and one launch, which also says when a slot is repeated or past the cache). The oracle's
own arithmetic encodes the call's tokens (``encode_planes``, packed by ``pack_encoded``: neither
reads a value back), so the check is the oracle by construction under every writer revision
(``writer_rules``), NaN, inf and exact ties included. About 70 launches on the device, all
asynchronous: what the full path spends on an nvfp4 writer case is its syncs, copies and second
run, not this arithmetic.

Every record of the cache past its zero blocks is either written by exactly one token (its bytes
must be that token's encoding) or by none (its bytes must be the ones before the call); the zero
blocks must still be zeros (no slot maps there; the full path checks the same). The caches are
compared as 8-byte words, a written record gathered by its slot. Anything this check cannot tell
(a repeated slot, a slot past the cache, an unknown revision, dtypes, shapes or devices it does
not read, a packed multi-layer cache) is "cannot tell", never a verdict. Under ``--ties either`` a
tie's other neighbour is a mismatch here: the full path's review then accepts it.
"""

from __future__ import annotations

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.launch import Launchers
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.fast.writer import slot_owners
from mlafuzz.harness.ops.nvfp4_writer import revision_of
from mlafuzz.harness.ops.op import Outputs
from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.nvfp4_record import pack_encoded
from mlafuzz.oracles.formats.nvfp4_write import encode_planes
from mlafuzz.oracles.formats.table import get

__all__ = ["check", "nvfp4_records_flag", "takes"]

FORMAT = get("nvfp4_ds_mla")
RECORD_BYTES = FORMAT.record_bytes  # 352 = 44 words of 8 bytes
_WORD = 8
if RECORD_BYTES % _WORD:
    raise ImportError(f"an nvfp4_ds_mla record of {RECORD_BYTES} bytes is not whole 8-byte words")


def _words(cache: torch.Tensor) -> torch.Tensor | None:
    """A uint8 (or float8 view) cache [blocks, bs, 352] as int64 words [blocks * bs, 44]; None for
    anything else. A cache that is not contiguous is copied (not a case a run draws)."""
    if cache.dtype == torch.float8_e4m3fn:
        cache = cache.view(torch.uint8)
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != RECORD_BYTES:
        return None
    if not cache.is_contiguous() or cache.data_ptr() % _WORD:
        cache = cache.clone(memory_format=torch.contiguous_format)
    return cache.view(-1, RECORD_BYTES).view(torch.int64)


def _rows(t: torch.Tensor, width: int) -> bool:
    return t.dtype in (torch.bfloat16, torch.float16) and t.dim() == 2 and t.shape[1] == width


def nvfp4_records_flag(
    *,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache_before: torch.Tensor,
    kv_cache_after: torch.Tensor,
    slot_mapping: torch.Tensor,
    flag: torch.Tensor,
    revision: str = writer_rules.DEFAULT,
    zero_blocks: int = 0,
    launchers: Launchers | None = None,
) -> bool:
    """Sets ``flag`` (a zeroed int tensor [2] on the cache's device: the board's two slots) with no
    host synchronization: element 0 to 1 when ``kv_cache_after`` is not byte for byte what the
    writer ``revision`` makes of ``kv_cache_before``, element 1 to 2 when a slot is repeated or past
    the cache (the full path decides). ``zero_blocks``: the cache's first blocks, which hold zeros
    and which no slot maps to (``Case.zero_blocks``; the oracle's slots are shifted past them).
    False, nothing set: it cannot tell from the host side (an unknown revision, shapes, dtypes or
    devices it does not read)."""
    if revision not in writer_rules.names():
        return False
    dev = kv_cache_after.device
    if any(t.device != dev for t in (kv_c, k_pe, kv_cache_before, slot_mapping, flag)):
        return False
    if kv_cache_after.dtype != torch.uint8 or kv_cache_before.shape != kv_cache_after.shape:
        return False  # the oracle's cache is uint8 of the input's shape: anything else is the comparator's
    if slot_mapping.dtype.is_floating_point or slot_mapping.is_complex() or slot_mapping.dtype == torch.bool:
        return False
    n = slot_mapping.numel()
    if not (_rows(kv_c, FORMAT.nope_dim) and _rows(k_pe, FORMAT.rope_dim)) or n > min(kv_c.shape[0], k_pe.shape[0]):
        return False
    after, before = _words(kv_cache_after), _words(kv_cache_before)
    if after is None or before is None:
        return False
    head = zero_blocks * kv_cache_after.shape[1]  # records in the zero blocks
    num_slots = after.shape[0] - head
    if zero_blocks < 0 or num_slots < 0:
        return False
    slots = slot_mapping.reshape(-1)
    if head:  # the oracle's slots: a slot into the zero blocks writes nothing there (the head must stay 0)
        slots = torch.where(slots >= 0, slots - head, slots)
    inv = slot_owners(slot_mapping=slots, num_slots=num_slots, launchers=launchers)
    after_tail, before_tail = after[head:], before[head:]
    # A record no token writes keeps its bytes.
    bad = (after_tail.ne(before_tail).any(dim=1) & inv[:num_slots].lt(0)).any()
    if head:
        bad = bad | after[:head].any()  # no slot maps there: still zeros
    if n and num_slots:  # with no records, every slot >= 0 is past the cache: "cannot tell" below
        p = encode_planes(kv_c=kv_c[:n], k_pe=k_pe[:n], revision=revision)
        want = pack_encoded(codes=p.codes, scales=p.scales, rope=p.rope).view(torch.int64)  # [n, 44]
        # A token's record, gathered by its slot (clamped: a slot past the cache is "cannot tell" below).
        idx = slots.clamp(0, num_slots - 1)
        got = after_tail.index_select(0, idx if idx.dtype in (torch.int32, torch.int64) else idx.long())
        bad = bad | (got.ne(want).any(dim=1) & slots.ge(0)).any()
    flag[0:1].copy_(bad.reshape(1))
    flag[1:2].copy_(inv[num_slots:].ge(0) * 2)  # a repeated slot or one past the cache
    return True


def takes(case: Case) -> bool:
    """A cache that is the whole of its storage: one layer's view of a packed multi-layer cache has
    bytes outside the view that the check does not see (the full path compares them). Read from
    the tensor, not the spec: the nvfp4 writer's spec carries the fp8 writer's ``layers`` field,
    which its generator does not build (about a quarter of drawn cases name layers > 1, all with a plain cache)."""
    cache = case.tensors.get("kv_cache")
    return (
        isinstance(cache, torch.Tensor)
        and cache.storage_offset() == 0
        and cache.untyped_storage().nbytes() == cache.numel() * cache.element_size()
    )


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState | None) -> bool:
    """The fast path's check of an nvfp4 writer call (no guarded outputs: ``second`` is never given)."""
    if second is not None:
        return False
    t, after = case.tensors, outputs.get("kv_cache")
    if not isinstance(after, torch.Tensor):
        return False
    return nvfp4_records_flag(
        kv_c=t["kv_c"],
        k_pe=t["k_pe"],
        kv_cache_before=t["kv_cache"],
        kv_cache_after=after,
        slot_mapping=t["slot_mapping"],
        flag=flag,
        revision=revision_of(case),
        zero_blocks=case.zero_blocks.get("kv_cache", 0),
        launchers=state.launchers if state is not None else None,
    )
