"""A fused fast path for checking the writer: recompute every record, compare with the cache, one pass.

Like harness/fast/gather.py, a filter: ``writer_records_flag`` says "the
oracle's" only when ``kv_cache_after`` is byte for byte what
``oracles.codec.write_records`` makes from ``kv_cache_before`` under the
case's contract revision (SPEC section 2, "Writer", and section 7: the
``POW2_SCALE`` constexpr, from the revision's ``writer_scale`` rule); anything else sends the
harness to the oracle and the comparator. Anything outside the simple case
(duplicate slots, a slot past the cache, odd dtypes or shapes, mixed devices)
is "cannot tell".

One program per cache record. A slot -> token map (``slot_owners``: one
scatter into a fresh buffer) says whether the record is written; if it is, the program recomputes
the token's record, else the expected record is the one in ``kv_cache_before``;
either way it is compared with ``kv_cache_after`` byte for byte (NaN payloads
included: the writer's bytes are exact). So the whole check reads the cache
twice (before, after) and the inputs once: about one pass over the bytes.

Each step is codec.encode_rows's arithmetic, spelled so nothing can bend it:

- kv_c (bf16 or fp16) -> f32 is exact, decoded from the 16-bit patterns with
  integer arithmetic (the CPU interpreter's own bf16 -> f32 mangles subnormals);
- amax is the integer max of the |x| bit patterns with NaNs replaced by +0
  (non-negative floats order like their bits; fmaxf ignores NaN, identity 0);
  an inf element gives amax = inf;
- scale = max(amax / 448, FLT_MIN) (2026-07): one IEEE f32 division rounded
  to nearest even (on the GPU the PTX ``div.rn.f32``, no ``.ftz``; under the
  CPU interpreter numpy's f32 divide), then the max taken on the bits (the
  quotient is never NaN), so a zero or subnormal quotient becomes FLT_MIN;
- under 2026-09 the same quotient, floored at 1e-4f (0x38D1B717) on the bits,
  then rounded up to a power of two exactly on the bits (the oracle's exact
  rule, not log2f): a non-zero mantissa bumps the exponent and clears the
  mantissa, a power of two and inf stay; s >= 1e-4f is normal, so no
  subnormal case;
- code = satfinite e4m3fn RNE of x / scale (same IEEE division); on sm_89+ the
  PTX ``cvt.rn.satfinite.e4m3x2.f32`` with NaN made 0x7F, elsewhere done with
  integer arithmetic on the f32 bits: NaN -> 0x7F whatever its sign; |y|
  clamped to 448 (inf -> 448, code 0x7E); normals (|y| >= 2**-6) round the
  significand to 3 bits with ``+ 0x7FFFF + lsb`` and rebias; below, the code
  is |y| * 2**9 rounded half to even, shifted out of the significand;
  the sign bit is kept (so -0 -> 0x80);
- rope: the 64 16-bit patterns of k_pe, raw.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.ieee import div_rn, quiet, use_asm, use_cvt
from mlafuzz.harness.fast.launch import Launchers
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import Outputs
from mlafuzz.oracles import revisions
from mlafuzz.oracles.formats import table as formats

# The record written: fp8_ds_mla's row of the format table; its stride and plane offsets reach the
# kernel as constexprs (the kernel's tile shapes, 4 x 128 codes and 64 RoPE values, stay its own).
FORMAT = formats.get("fp8_ds_mla")
RECORD_BYTES = FORMAT.record_bytes
# writer_scale rule -> the kernel's POW2_SCALE constexpr; a rule not here is "cannot tell".
_SCALE_RULES = {"flt_min": False, "pow2_1e-4": True}


@triton.jit
def _e4m3fn_satfinite(y):
    """e4m3fn code (int32 0..255) of f32 y: RNE, finite values saturate to +-448, NaN -> 0x7F."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    mag = bits & 0x7FFFFFFF
    is_nan = mag > 0x7F800000
    a = tl.minimum(mag, 0x43E00000)  # |y| clamped to 448.0f (inf included), on the bits
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    # Subnormal e4m3fn range: round_half_even(|y| * 2**9) from the significand and exponent.
    exp = a >> 23
    sig = (a & 0x7FFFFF) | tl.where(exp > 0, 0x800000, 0)
    shift = tl.minimum(141 - tl.maximum(exp, 1), 30)  # |y| * 2**9 = sig * 2**-shift; >= 21 here
    q = sig >> shift
    rem = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    sub = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    code = tl.where(a >= 0x3C800000, normal, sub) | (sign << 7)  # 0x3C800000: 2**-6, the smallest normal
    return tl.where(is_nan, 0x7F, code)


@triton.jit
def _e4m3fn_code(y, USE_CVT: tl.constexpr):
    """_e4m3fn_satfinite(y); on sm_89+ the PTX conversion (RNE, satfinite), two elements per
    instruction instead of ~35 integer operations each, NaN made 0x7F here whatever its sign."""
    if USE_CVT:
        code = tl.inline_asm_elementwise(
            """{
            .reg .b16 h;
            .reg .b32 w;
            cvt.rn.satfinite.e4m3x2.f32 h, $3, $2;
            cvt.u32.u16 w, h;
            and.b32 $0, w, 255;
            shr.u32 $1, w, 8;
            }""",
            "=r,=r,f,f",
            [y],
            dtype=tl.int32,
            is_pure=True,
            pack=2,
        )
        return tl.where(y != y, 0x7F, code)
    else:
        return _e4m3fn_satfinite(y)


@triton.jit
def _f32_bits_of_16(h, is_bf16):
    """f32 bit pattern (int32) of the bf16 / fp16 value with 16-bit pattern h (int32 0..0xFFFF); exact.
    ``is_bf16``: a runtime flag (the inputs' dtype), so one compiled check serves both dtypes.

    Integer decode rather than a conversion instruction: Triton's CPU interpreter
    turns bf16 subnormals into wrong f32 values."""
    sign = (h >> 15) << 31
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    normal = ((exp + 112) << 23) | (man << 13)  # rebias 15 -> 127
    special = (255 << 23) | (man << 13)  # inf, NaN
    # Subnormal: man * 2**-24, from man's exact f32 (>= 1.0) by lowering its exponent field by 24.
    sub = tl.where(man == 0, 0, man.to(tl.float32).to(tl.int32, bitcast=True) - (24 << 23))
    mag = tl.where(exp == 0x1F, special, tl.where(exp == 0, sub, normal))
    return tl.where(is_bf16 != 0, h << 16, sign | mag)


# kv and pe come as int16 views of the bf16 / fp16 inputs and the dtype as a runtime flag: each
# dtype was a variant of its own (~0.5 s to compile in every worker of a cold run).
@triton.jit(do_not_specialize=["is_bf16"])
def _check_records(
    after8_ptr,
    before8_ptr,
    kv16_ptr,
    pe16_ptr,
    inv_ptr,
    bad_ptr,
    kv_stride,
    pe_stride,
    is_bf16,
    USE_ASM: tl.constexpr,
    USE_CVT: tl.constexpr,
    POW2_SCALE: tl.constexpr,
    RECORD_BYTES: tl.constexpr,
    SCALE_AT: tl.constexpr,
    ROPE_AT: tl.constexpr,
):
    # The caches' bytes read as 16- and 32-bit words too, and the 16-bit floats as their patterns:
    # pointer casts here rather than typed views on the host (a view costs a few us there).
    after16_ptr = after8_ptr.to(tl.pointer_type(tl.int16))
    after32_ptr = after8_ptr.to(tl.pointer_type(tl.int32))
    before16_ptr = before8_ptr.to(tl.pointer_type(tl.int16))
    before32_ptr = before8_ptr.to(tl.pointer_type(tl.int32))
    r = tl.program_id(0).to(tl.int64)
    # inv[r]: the token writing record r, -1 for none (slot_owners). Slots this check does not
    # handle (repeated, past the cache; inv's entry past the last record): program 0 says so in
    # bad[1], a slot of its own, so no mismatch store can overwrite it.
    tl.store(bad_ptr + 1, 2, mask=(r == 0) & (tl.load(inv_ptr + tl.num_programs(0)) >= 0))
    owner = tl.load(inv_ptr + r)
    written = owner >= 0
    t0 = tl.where(written, owner, 0)
    # Byte offset of the record: a multiple of 16 (the format's align), said so the loads vectorize.
    rec = tl.multiple_of(r * RECORD_BYTES, 16)
    tiles = tl.arange(0, 4)
    cols = tiles[:, None] * 128 + tl.arange(0, 128)[None, :]  # [4, 128]: element e of tile e // 128
    rcols = tl.arange(0, 64)
    # The masks below broadcast the scalar `written` over a block and compare with False: under
    # the CPU interpreter the broadcast scalar is an integer array, which Triton >= 3.7's
    # interpreter rejects as a mask, and the compare makes it bool; compiled, it folds away.
    # What the record must hold if no token writes it: its old bytes.
    old_code = tl.load(before8_ptr + rec + cols, mask=(~written & (cols >= 0)) != False, other=0).to(tl.int32)  # noqa: E712 (a bool mask: see above)
    old_scale = tl.load(before32_ptr + (rec + SCALE_AT) // 4 + tiles, mask=(~written & (tiles >= 0)) != False, other=0)  # noqa: E712 (a bool mask: see above)
    old_rope = tl.load(before16_ptr + (rec + ROPE_AT) // 2 + rcols, mask=(~written & (rcols >= 0)) != False, other=0)  # noqa: E712 (a bool mask: see above)
    # What it must hold if token t0 writes it: the token's encoding.
    h = (
        tl.load(
            kv16_ptr + t0 * kv_stride + cols,
            mask=(written & (cols >= 0)) != False,  # noqa: E712 (a bool mask: see above)
            other=0,
        ).to(tl.int32)
        & 0xFFFF
    )
    fbits = _f32_bits_of_16(h, is_bf16)
    x = fbits.to(tl.float32, bitcast=True)
    xbits = fbits & 0x7FFFFFFF
    amax_bits = tl.max(tl.where(xbits > 0x7F800000, 0, xbits), axis=1)  # [4]: NaN ignored, identity +0
    amax = amax_bits.to(tl.float32, bitcast=True)
    q = div_rn(amax, tl.full([4], 448.0, tl.float32), USE_ASM)
    q_bits = q.to(tl.int32, bitcast=True)  # q >= +0 and never NaN: its bits order like its values
    if POW2_SCALE:  # writer_scale pow2_1e-4 (2026-09 on): max(q, 1e-4f), then the power of two >= it
        s_bits = tl.maximum(q_bits, 0x38D1B717)
        s_exp = s_bits & 0x7F800000
        scale_bits = tl.where(((s_bits & 0x7FFFFF) == 0) | (s_exp == 0x7F800000), s_bits, s_exp + 0x00800000)
    else:  # writer_scale flt_min (2026-07): max(q, FLT_MIN)
        scale_bits = tl.maximum(q_bits, 0x00800000)
    scale = tl.broadcast_to(scale_bits.to(tl.float32, bitcast=True)[:, None], (4, 128))
    new_code = _e4m3fn_code(div_rn(x, scale, USE_ASM), USE_CVT)
    new_rope = tl.load(pe16_ptr + t0 * pe_stride + rcols, mask=(written & (rcols >= 0)) != False, other=0)  # noqa: E712 (a bool mask: see above)
    exp_code = tl.where(written, new_code, old_code)
    exp_scale = tl.where(written, scale_bits, old_scale)
    exp_rope = tl.where(written, new_rope, old_rope)
    # Compare with the cache after the call.
    code = tl.load(after8_ptr + rec + cols).to(tl.int32)
    sc = tl.load(after32_ptr + (rec + SCALE_AT) // 4 + tiles)
    rope = tl.load(after16_ptr + (rec + ROPE_AT) // 2 + rcols)
    # A mismatch sets bad[0] = 1 (masked stores: no reductions, nothing to synchronize).
    tl.store(bad_ptr + tl.zeros_like(code), 1, mask=code != exp_code)
    tl.store(bad_ptr + tl.zeros_like(sc), 1, mask=sc != exp_scale)
    tl.store(bad_ptr + tl.zeros_like(rope), 1, mask=rope != exp_rope)


def _record_bytes(cache: torch.Tensor) -> torch.Tensor | None:
    if cache.dtype == torch.float8_e4m3fn:
        cache = cache.view(torch.uint8)
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != RECORD_BYTES:
        return None
    if not cache.is_contiguous() or cache.data_ptr() % 16:
        cache = cache.clone(memory_format=torch.contiguous_format)  # the kernel's word loads need alignment
    return cache


def _rows(t: torch.Tensor, width: int) -> torch.Tensor | None:
    if t.dtype not in (torch.bfloat16, torch.float16) or t.dim() != 2 or t.shape[1] != width:
        return None
    return t if t.stride(1) == 1 else t.contiguous()


# Counts vary per case: specialized (== 1, % 16), each new combination would be a compile that
# warmup's cases never met.
@triton.jit(do_not_specialize=["n", "num_slots"])
def _scatter_owners(slots_ptr, n, num_slots, inv_ptr, BLOCK: tl.constexpr):
    """inv[slot] = token for each token with a slot in [0, num_slots); inv[num_slots] = 1 when a
    slot is past the cache or taken twice (the exchange returns the earlier token: not -1)."""
    tok = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = tok < n
    slot = tl.load(slots_ptr + tok, mask=live, other=-1).to(tl.int64)
    write = live & (slot >= 0) & (slot < num_slots)
    old = tl.atomic_xchg(inv_ptr + tl.where(write, slot, 0), tok, mask=write)
    bad = (write & (old >= 0)) | (live & (slot >= num_slots))
    tl.store(inv_ptr + num_slots + tl.zeros_like(tok), 1, mask=bad)


def slot_owners(*, slot_mapping: torch.Tensor, num_slots: int, launchers: Launchers | None = None) -> torch.Tensor:
    """inv, int64 [num_slots + 1]: inv[s] is the token writing cache slot s (-1: none), and
    inv[num_slots] >= 0 when some slot is repeated or out of range (cases the check leaves to the
    full one). One fill and one launch."""
    slots = slot_mapping if slot_mapping.dim() == 1 else slot_mapping.reshape(-1)
    if not slots.is_contiguous():
        slots = slots.contiguous()
    inv = torch.full((num_slots + 1,), -1, dtype=torch.int64, device=slots.device)
    n = slots.numel()
    if n:
        block = 1024
        (launchers or Launchers())(_scatter_owners)(-(-n // block), (slots, n, num_slots, inv), {"BLOCK": block})
    return inv


def writer_records_flag(
    *,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache_before: torch.Tensor,
    kv_cache_after: torch.Tensor,
    slot_mapping: torch.Tensor,
    flag: torch.Tensor | None = None,
    launchers: Launchers | None = None,
    revision: str = NEWEST_REVISION,
) -> torch.Tensor | None:
    """A device int32 flag: 0 when kv_cache_after is exactly the oracle's, 1 when it differs,
    2 when the slots are ones this check does not handle (duplicate or out of range: the full
    check decides); None when it cannot tell from the host side (shapes, dtypes, devices it
    does not read). No host synchronization. ``flag``: a zeroed int tensor [2] on the cache's
    device to set instead (element 0: 1 when it differs; element 1: 2 when the slots are not
    handled); it is returned as it is, the caller reading the larger of the two. ``revision``: the
    contract revision whose scale rule the records must follow (None from an unknown one)."""
    rule = revisions.get(revision).rule("writer_scale") if revision in revisions.names() else None
    if rule not in _SCALE_RULES:
        return None
    dev = kv_cache_after.device
    if any(t.device != dev for t in (kv_c, k_pe, kv_cache_before, slot_mapping)):
        return None
    if kv_cache_after.dtype != torch.uint8 or kv_cache_before.shape != kv_cache_after.shape:
        return None  # the oracle's cache is uint8 of the input's shape: anything else is the comparator's
    if slot_mapping.dtype.is_floating_point:
        return None
    if slot_mapping.dtype == torch.bool or slot_mapping.is_complex():
        return None
    kv, pe = _rows(kv_c, FORMAT.nope_dim), _rows(k_pe, FORMAT.rope_dim)
    n = slot_mapping.numel()
    if kv is None or pe is None or n > min(kv.shape[0], pe.shape[0]) or n >= 2**31:
        return None
    after, before = _record_bytes(kv_cache_after), _record_bytes(kv_cache_before)
    if after is None or before is None:
        return None
    num_slots = kv_cache_after.shape[0] * kv_cache_after.shape[1]
    if num_slots == 0:
        return None  # nothing to launch over: let the full path decide
    launchers = launchers or Launchers()
    inv = slot_owners(slot_mapping=slot_mapping, num_slots=num_slots, launchers=launchers)
    bad = flag if flag is not None else torch.zeros(2, dtype=torch.int32, device=dev)
    # One warp per record: the amax of each 128-code tile reduces within the warp (no barriers);
    # on sm_90 that issues ~40% fewer instructions per record than 4 warps (1176 vs 2016).
    with quiet():  # under the interpreter inf / inf is meant (NaN), not a warning
        is_bf16 = int(kv.dtype == torch.bfloat16)
        halves = (kv.view(torch.int16), pe.view(torch.int16))
        args = (after, before, *halves, inv, bad, kv.stride(0), pe.stride(0), is_bf16)
        launchers(_check_records)(
            num_slots,
            args,
            {
                "USE_ASM": use_asm(dev),
                "USE_CVT": use_cvt(dev),
                "POW2_SCALE": _SCALE_RULES[rule],
                "RECORD_BYTES": RECORD_BYTES,
                "SCALE_AT": FORMAT.plane("scale").offset,
                "ROPE_AT": FORMAT.plane("rope").offset,
            },
            num_warps=1,
        )
    return flag if flag is not None else bad.max().reshape(1)


def takes(case: Case) -> bool:
    """Not a cache that is one layer of a packed multi-layer cache: the fused check sees this
    layer's records only, not the other layers' bytes (the full path compares them)."""
    return getattr(case.spec, "layers", 1) == 1


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    """The fast path's check of a writer call (no guarded outputs: ``second`` is never given)."""
    if second is not None:
        return False
    t, after = case.tensors, outputs.get("kv_cache")
    if not isinstance(after, torch.Tensor):
        return False
    return (
        writer_records_flag(
            kv_c=t["kv_c"],
            k_pe=t["k_pe"],
            kv_cache_before=t["kv_cache"],
            kv_cache_after=after,
            slot_mapping=t["slot_mapping"],
            flag=flag,
            launchers=state.launchers,
            revision=case.params.get("revision") or NEWEST_REVISION,
        )
        is not None
    )
