"""The fast path's check of nvfp4_writer (the op row's ``fast``): the cache after the call against
the oracle's records (oracles/formats/nvfp4_write.py, SPEC 11.3) under the case's writer
revision, recomputed on the device in one Triton launch and compared there, the verdict written
into the board with no sync.

Like harness/fast/writer.py (whose ``slot_owners`` map, its 16-bit decode and its e4m3 encode this
check shares): one program per cache record past the zero blocks (a block of records per program
under the CPU interpreter, whose cost is per operation). A record is either written
by exactly one token (its bytes must be that token's encoding) or by none (its bytes must be the
ones before the call); the zero blocks must still be zeros (no slot maps there; the full path
checks the same, one reduction here). Anything this check cannot tell (a repeated slot, a slot
past the cache, an unknown writer revision, dtypes, shapes or devices it does not read, a packed
multi-layer cache) is "cannot tell", never a verdict. Under ``--ties either`` a record that
differs is "cannot tell" too: the full path's review accepts an exact tie's other neighbour and
counts it apart (an info), and a difference this check called a mismatch that the full path then
accepts would be filed as a non-reproduced one (NONDETERMINISM, drive/run.py).

Each step is the oracle's arithmetic (nvfp4_write.py's module docstring), spelled so nothing can
bend it: kv_c and k_pe decoded from their 16-bit patterns (exact, subnormals kept); amax the
integer max of the |x| bit patterns with NaN made +0; ``max(amax / 6, 2^-9)`` one IEEE division
(``div.rn.f32`` on the GPU) and a max on the bits; its e4m3 byte by writer.py's RNE satfinite
encode; under ``rn_bump`` the next byte up where that byte's exact value is below the target and
it is not 448; the quotient ``x * f32(1 / sf)`` (``mul_recip``, ``div.rn`` then ``mul.rn``) or
``x / sf`` (``div``); its e2m1 code counted against the exact midpoints between neighbouring
magnitudes (a tie to the even code, saturating at 6, the sign kept, NaN -> 0); codes 2i and
2i + 1 packed low and high nibble; block s's scale byte at ``8 * (s & 3) + (s >> 2)`` of the
scale plane; RoPE e4m3 RNE satfinite (NaN -> 0x7F).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.ieee import INTERPRETED, div_rn, mul_rn, quiet, use_asm, use_cvt
from mlafuzz.harness.fast.launch import Launchers
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.fast.writer import _e4m3fn_code, _f32_bits_of_16, slot_owners
from mlafuzz.harness.ops.nvfp4.writer import revision_of
from mlafuzz.harness.ops.op import Outputs
from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.table import get

__all__ = ["check", "nvfp4_records_flag", "takes"]

FORMAT = get("nvfp4_ds_mla")
RECORD_BYTES = FORMAT.record_bytes
# Writer rule values -> the kernel's constexprs; a value not here makes the import fail (a new
# rule value needs its arithmetic here first).
_BUMP = {"rn_bump": True, "rn": False}
_MUL_RECIP = {"mul_recip": True, "div": False}
if set(_BUMP) != set(writer_rules.RULES["scale_rounding"]) or set(_MUL_RECIP) != set(writer_rules.RULES["quotient"]):
    raise ImportError(f"writer rules {dict(writer_rules.RULES)} are not the ones the nvfp4 writer check computes")
# Records per program: one on the GPU (one warp each, as writer.py's check); under the CPU
# interpreter, whose cost is per operation and program, not per element, a block of them.
_RECS_INTERPRETED = 32
# The kernel computes block s's scale byte as 8 * (s & 3) + (s >> 2) (SPEC 11.1): the format table's.
if tuple(8 * (s & 3) + (s >> 2) for s in range(FORMAT.scales)) != tuple(FORMAT.scale_slots):
    raise ImportError("the nvfp4_ds_mla scale permutation is not the one the check's kernel computes")


@triton.jit
def _e4m3_value(code):
    """f32 value of positive e4m3fn bytes 0x00..0x7E (int32), exact: a normal's bits rebiased, a
    subnormal m * 2^-9 from m's own f32 (exact) with its exponent lowered by 9."""
    e = code >> 3
    m = code & 7
    normal = ((e + 120) << 23) | (m << 20)
    sub = tl.where(m == 0, 0, m.to(tl.float32).to(tl.int32, bitcast=True) - (9 << 23))
    return tl.where(e > 0, normal, sub).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_code(q):
    """e2m1 code (int32 0..15) of f32 q: nearest, ties to the even code, saturating at 6 (inf
    included), the sign kept (-0 -> 8); NaN -> 0. Counted against the midpoints of neighbouring
    magnitudes, strictly where the lower code is the even one."""
    bits = q.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    a = mag.to(tl.float32, bitcast=True)
    code = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    code = code | (((bits >> 31) & 1) << 3)
    return tl.where(mag > 0x7F800000, 0, code)


# Counts vary per case: specialized (== 1, % 16), each new combination would be a compile.
# kv and pe come as int16 views and their dtype as a runtime flag (as the fp8 writer's check).
@triton.jit(do_not_specialize=["num_records", "is_bf16"])
def _check_records(
    after8_ptr,
    before8_ptr,
    kv16_ptr,
    pe16_ptr,
    inv_ptr,
    bad_ptr,
    kv_stride,
    pe_stride,
    num_records,
    is_bf16,
    USE_ASM: tl.constexpr,
    USE_CVT: tl.constexpr,
    BUMP: tl.constexpr,
    MUL_RECIP: tl.constexpr,
    RECORD_BYTES: tl.constexpr,
    NOPE_AT: tl.constexpr,
    SCALE_AT: tl.constexpr,
    ROPE_AT: tl.constexpr,
    TILES: tl.constexpr,
    PAIRS: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    RECS: tl.constexpr,
    DIFFER_AT: tl.constexpr,
    DIFFER: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * RECS + tl.arange(0, RECS)  # [RECS] records
    live = r < num_records
    # inv[r]: the token writing record r, -1 for none (slot_owners). A repeated slot or one past
    # the cache (inv's entry past the last record): program 0 says so in bad[1].
    tl.store(bad_ptr + 1, 2, mask=(tl.program_id(0) == 0) & (tl.load(inv_ptr + num_records) >= 0))
    owner = tl.load(inv_ptr + r, mask=live, other=-1)
    written = owner >= 0
    t0 = tl.where(written, owner, 0)
    rec = r * RECORD_BYTES
    tiles = tl.arange(0, TILES)
    byte = (tiles[:, None] * PAIRS + tl.arange(0, PAIRS)[None, :])[None, :, :]  # [1, TILES, PAIRS]: NoPE byte i
    place = (SCALE_AT + 8 * (tiles & 3) + (tiles >> 2))[None, :]  # [1, TILES]: block s's scale byte
    rcols = tl.arange(0, ROPE_DIM)[None, :]
    nope_at = rec[:, None, None] + NOPE_AT + byte
    scale_at = rec[:, None] + place
    rope_at = rec[:, None] + ROPE_AT + rcols
    live_b = live[:, None, None] & (byte >= 0)
    live_s = live[:, None] & (place >= 0)
    live_r = live[:, None] & (rcols >= 0)
    new_b = written[:, None, None] & live_b
    new_s = written[:, None] & live_s
    new_r = written[:, None] & live_r
    # What a record must hold if no token writes it: its old bytes.
    old_nope = tl.load(before8_ptr + nope_at, mask=live_b & ~new_b, other=0).to(tl.int32)
    old_scale = tl.load(before8_ptr + scale_at, mask=live_s & ~new_s, other=0).to(tl.int32)
    old_rope = tl.load(before8_ptr + rope_at, mask=live_r & ~new_r, other=0).to(tl.int32)
    # What it must hold if token t0 writes it: the token's encoding. Byte i packs elements 2i, 2i + 1.
    row = kv16_ptr + t0[:, None, None] * kv_stride + 2 * byte
    fe = _f32_bits_of_16(tl.load(row, mask=new_b, other=0).to(tl.int32) & 0xFFFF, is_bf16)
    fo = _f32_bits_of_16(tl.load(row + 1, mask=new_b, other=0).to(tl.int32) & 0xFFFF, is_bf16)
    # amax on the bits (NaN left out: 0, fmaxf's identity), then max(amax / 6, 2^-9) on the bits.
    ae = fe & 0x7FFFFFFF
    ao = fo & 0x7FFFFFFF
    amax_bits = tl.maximum(
        tl.max(tl.where(ae > 0x7F800000, 0, ae), axis=2), tl.max(tl.where(ao > 0x7F800000, 0, ao), axis=2)
    )  # [RECS, TILES]
    target = div_rn(amax_bits.to(tl.float32, bitcast=True), tl.full([RECS, TILES], 6.0, tl.float32), USE_ASM)
    # 0x3B000000: 2^-9, the smallest positive e4m3 (the quotient is >= +0, never NaN: bits order like values)
    target = tl.maximum(target.to(tl.int32, bitcast=True), 0x3B000000).to(tl.float32, bitcast=True)
    sf = _e4m3fn_code(target, USE_CVT)  # 0x01..0x7E: target is positive, never NaN
    if BUMP:  # rn_bump: the next e4m3 up where the nearest fell below the target (not past 448)
        sf = sf + ((_e4m3_value(sf) < target) & (sf < 0x7E)).to(tl.int32)
    sval = _e4m3_value(sf)
    xe = fe.to(tl.float32, bitcast=True)
    xo = fo.to(tl.float32, bitcast=True)
    if MUL_RECIP:  # x * f32(1 / sf): two roundings
        recip = div_rn(tl.full([RECS, TILES], 1.0, tl.float32), sval, USE_ASM)
        s3 = tl.broadcast_to(recip[:, :, None], (RECS, TILES, PAIRS))
        qe = mul_rn(xe, s3, USE_ASM)
        qo = mul_rn(xo, s3, USE_ASM)
    else:  # x / sf: one
        s3 = tl.broadcast_to(sval[:, :, None], (RECS, TILES, PAIRS))
        qe = div_rn(xe, s3, USE_ASM)
        qo = div_rn(xo, s3, USE_ASM)
    new_nope = _e2m1_code(qe) | (_e2m1_code(qo) << 4)
    hp = tl.load(pe16_ptr + t0[:, None] * pe_stride + rcols, mask=new_r, other=0).to(tl.int32) & 0xFFFF
    new_rope = _e4m3fn_code(_f32_bits_of_16(hp, is_bf16).to(tl.float32, bitcast=True), USE_CVT)
    exp_nope = tl.where(new_b, new_nope, old_nope)
    exp_scale = tl.where(new_s, sf, old_scale)
    exp_rope = tl.where(new_r, new_rope, old_rope)
    # Compare with the cache after the call; a mismatch sets bad[DIFFER_AT] = DIFFER (bad[0] = 1, or
    # under --ties either bad[1] = 2: "cannot tell"), masked stores, no reduction.
    nope = tl.load(after8_ptr + nope_at, mask=live_b, other=0).to(tl.int32)
    scale = tl.load(after8_ptr + scale_at, mask=live_s, other=0).to(tl.int32)
    rope = tl.load(after8_ptr + rope_at, mask=live_r, other=0).to(tl.int32)
    tl.store(bad_ptr + DIFFER_AT + tl.zeros_like(nope), DIFFER, mask=live_b & (nope != exp_nope))
    tl.store(bad_ptr + DIFFER_AT + tl.zeros_like(scale), DIFFER, mask=live_s & (scale != exp_scale))
    tl.store(bad_ptr + DIFFER_AT + tl.zeros_like(rope), DIFFER, mask=live_r & (rope != exp_rope))


def _records(cache: torch.Tensor) -> torch.Tensor | None:
    """A uint8 (or float8 view) cache [blocks, bs, 352] as uint8 records [blocks * bs, 352]; None for
    anything else. A cache that is not contiguous is copied (not a case a run draws)."""
    if cache.dtype == torch.float8_e4m3fn:
        cache = cache.view(torch.uint8)
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != RECORD_BYTES:
        return None
    if not cache.is_contiguous():
        cache = cache.clone(memory_format=torch.contiguous_format)
    return cache.view(-1, RECORD_BYTES)


def _rows(t: torch.Tensor, width: int) -> torch.Tensor | None:
    if t.dtype not in (torch.bfloat16, torch.float16) or t.dim() != 2 or t.shape[1] != width:
        return None
    return t if t.stride(1) == 1 else t.contiguous()


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
    ties_either: bool = False,
    launchers: Launchers | None = None,
) -> bool:
    """Sets ``flag`` (a zeroed int tensor [2] on the cache's device: the board's two slots) with no
    host synchronization: element 0 to 1 when ``kv_cache_after`` is not byte for byte what the
    writer ``revision`` makes of ``kv_cache_before``, element 1 to 2 when a slot is repeated or past
    the cache (the full path decides). ``zero_blocks``: the cache's first blocks, which hold zeros
    and which no slot maps to (``Case.zero_blocks``; the oracle's slots are shifted past them).
    ``ties_either``: a record past them that differs sets element 1 to 2 instead of element 0 (the
    full path's review decides: see the module docstring). False, nothing set: it cannot tell from the host side (an unknown revision, shapes, dtypes or
    devices it does not read)."""
    if revision not in writer_rules.names():
        return False
    rules = writer_rules.get(revision).rules
    dev = kv_cache_after.device
    if any(t.device != dev for t in (kv_c, k_pe, kv_cache_before, slot_mapping, flag)):
        return False
    if kv_cache_after.dtype != torch.uint8 or kv_cache_before.shape != kv_cache_after.shape:
        return False  # the oracle's cache is uint8 of the input's shape: anything else is the comparator's
    if slot_mapping.dtype.is_floating_point or slot_mapping.is_complex() or slot_mapping.dtype == torch.bool:
        return False
    kv, pe = _rows(kv_c, FORMAT.nope_dim), _rows(k_pe, FORMAT.rope_dim)
    n = slot_mapping.numel()
    if kv is None or pe is None or kv.dtype != pe.dtype or n > min(kv.shape[0], pe.shape[0]) or n >= 2**31:
        return False
    after, before = _records(kv_cache_after), _records(kv_cache_before)
    if after is None or before is None or zero_blocks < 0:
        return False
    head = zero_blocks * kv_cache_after.shape[1]  # records in the zero blocks
    num_slots = after.shape[0] - head
    if num_slots <= 0:  # no records past the zero blocks: with a token, its slot is past the cache
        if n or num_slots < 0:
            return False
        flag[0:1].copy_(after.any().reshape(1))
        return True
    slots = slot_mapping.reshape(-1)
    if head:  # the oracle's slots: a slot into the zero blocks writes nothing there (the head must stay 0)
        slots = torch.where(slots >= 0, slots - head, slots)
    launchers = launchers or Launchers()
    inv = slot_owners(slot_mapping=slots, num_slots=num_slots, launchers=launchers)
    recs = _RECS_INTERPRETED if INTERPRETED else 1
    with quiet():  # under the interpreter inf / 6 and the like are meant, not warnings
        launchers(_check_records)(
            -(-num_slots // recs),
            (after[head:], before[head:], kv.view(torch.int16), pe.view(torch.int16), inv, flag)
            + (kv.stride(0), pe.stride(0), num_slots, int(kv.dtype == torch.bfloat16)),
            {
                "USE_ASM": use_asm(dev),
                "USE_CVT": use_cvt(dev),
                "BUMP": _BUMP[rules["scale_rounding"]],
                "MUL_RECIP": _MUL_RECIP[rules["quotient"]],
                "RECORD_BYTES": RECORD_BYTES,
                "NOPE_AT": FORMAT.plane("nope").offset,
                "SCALE_AT": FORMAT.plane("scale").offset,
                "ROPE_AT": FORMAT.plane("rope").offset,
                "TILES": FORMAT.scales,
                "PAIRS": FORMAT.scale_block // 2,
                "ROPE_DIM": FORMAT.rope_dim,
                "RECS": recs,
                "DIFFER_AT": 1 if ties_either else 0,
                "DIFFER": 2 if ties_either else 1,
            },
            num_warps=1,
        )
    if head:  # no slot maps there: still zeros
        flag[0:1].bitwise_or_(after[:head].any().reshape(1))
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
        ties_either=case.params.get("nvfp4_ties") == "either",
        launchers=state.launchers if state is not None else None,
    )
