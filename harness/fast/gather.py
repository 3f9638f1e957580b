"""A fused fast path for checking gather: recompute every expected row and compare, in one pass.

This is a filter, not a second oracle: ``gather_rows_flag`` answers "does dst
hold exactly what SPEC section 4 says?" (bits equal, NaN by position). When it
answers yes the harness skips the vectorized oracle and the comparator; when it
answers no, they run and produce the finding. So it must never say yes
wrongly; each step is the SPEC's own arithmetic, spelled so nothing can bend it:

- the fp8 code is decoded to its exact value: on sm_89 and later GPUs by the PTX
  conversion e4m3x2 -> f16x2 then f16 -> f32 (both exact: every e4m3fn value is
  an f16, subnormals included), elsewhere with integer arithmetic (sign,
  exponent, mantissa; subnormals and the NaN codes spelled out);
- the product with the f32 scale is one IEEE multiply rounded to nearest even,
  subnormals kept: on the GPU written as the PTX instruction ``mul.rn.f32``
  (no ``.ftz``, no contraction possible), under the CPU interpreter numpy's f32
  multiply (IEEE, no flush);
- f32 -> bf16 rounds to nearest even: the PTX ``cvt.rn.bf16x2.f32``, or the
  integer rounding on the bits (NaN is compared by position, so its payload
  never matters).

Held bit-identical to ``oracles.codec.dequant_records`` by tests over all 256
codes and random and extreme scale bit patterns, on the CPU (interpreter) and on
the GPU (the PTX path) (tests/test_oracles_fast_gather.py).

Its second job, ``gather_prefill``: before the kernel runs, fill dst so that no
byte already holds its expected value. A dst the check then finds equal to the
oracle's was written at every byte, so one run replaces the guards' two-run
write map (the harness's GPU fast path; anything it flags goes to the full path).

Cost: the fill and the check each read each record once and write or read each
dst row once with vector loads, two elements per 32-bit word: on the GPU about
seven conversion and multiply instructions and a handful of integer ones per
pair. A mismatch sets a flag with a masked store: nothing is counted, nothing
synchronized across warps.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.ieee import mul_rn, quiet, use_asm, use_cvt
from mlafuzz.harness.fast.launch import Launchers
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.memory.guards import Guarded
from mlafuzz.harness.ops.op import Outputs
from mlafuzz.oracles.formats import table as formats

# The record this check's kernels read: fp8_ds_mla's row of the format table. The kernel bodies
# below spell the tile shapes as their own constants (4 x 128 codes, 64 RoPE values); the
# planes' offsets reach them as constexprs, and the record stride is the cache's last dimension.
FORMAT = formats.get("fp8_ds_mla")
RECORD_BYTES = FORMAT.record_bytes
_SCALE_AT = FORMAT.plane("scale").offset
_ROPE_AT = FORMAT.plane("rope").offset
ROW_DIM = FORMAT.row_dim


@triton.jit
def _fp8_value(code, USE_ASM: tl.constexpr):
    """f32 value of e4m3fn code (int32 0..255), exact. The code's 7 magnitude bits placed at bit
    20 of an f32 (4 exponent bits at the bottom of its exponent field, 3 mantissa bits at the top
    of its mantissa) read as exactly 2^-120 times the code's magnitude: its exponent field is the
    code's biased exponent e (bias 127 instead of 7), and for e = 0 the f32 is subnormal just as
    the code is (m x 2^-129 = m x 2^-9 x 2^-120). One IEEE multiply by 2^120 (exact: a power of
    two, subnormal input kept) scales it back; then the sign bit; 0x7F / 0xFF are NaN (e4m3fn
    has no inf). About 8 operations where a field-by-field decode takes twice that: the fused
    check is ALU-bound, not memory-bound, at the realistic size."""
    mag = ((code & 0x7F) << 20).to(tl.float32, bitcast=True)
    v = mul_rn(mag, tl.full(mag.shape, 2.0**120, tl.float32), USE_ASM)
    bits = v.to(tl.int32, bitcast=True) | ((code << 24) & (-2147483648))
    bits = tl.where((code & 0x7F) == 0x7F, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _bf16_round(x):
    """bf16 bit pattern (int32 0..0xFFFF) of f32 x, round to nearest even; meaningless for a
    NaN x (the callers put a NaN pattern there themselves)."""
    f = x.to(tl.uint32, bitcast=True)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).to(tl.int32)


@triton.jit
def _expected_pairs(codes, scale, USE_ASM: tl.constexpr, USE_CVT: tl.constexpr):
    """The two bf16 elements (uint32: the first in the low half) SPEC section 4 makes of two
    e4m3fn codes (int16 ``codes``: the first in the low byte) and their tile's f32 scale: each
    bf16(fp8 value x scale), a NaN pattern where that is NaN.

    USE_CVT (sm_89 and later): the PTX conversions, seven instructions a pair: e4m3x2 -> f16x2
    (exact: every e4m3fn value, subnormals included, is an f16; NaN stays NaN), f16 -> f32
    (exact, no .ftz), ``mul.rn.f32`` (IEEE, no .ftz), f32x2 -> bf16x2 round to nearest even
    (subnormals kept, NaN canonical). Else the integer decode and rounding of each element."""
    if USE_CVT:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 h;
            .reg .b16 lo, hi;
            .reg .f32 a, b;
            cvt.rn.f16x2.e4m3x2 h, $1;
            mov.b32 {lo, hi}, h;
            cvt.f32.f16 a, lo;
            cvt.f32.f16 b, hi;
            mul.rn.f32 a, a, $2;
            mul.rn.f32 b, b, $2;
            cvt.rn.bf16x2.f32 $0, b, a;
            }""",
            "=r,h,f",
            [codes, scale],
            dtype=tl.uint32,
            is_pure=True,
            pack=1,
        )
    else:
        c = codes.to(tl.int32) & 0xFFFF
        lo = mul_rn(_fp8_value(c & 0xFF, USE_ASM), scale, USE_ASM)
        hi = mul_rn(_fp8_value(c >> 8, USE_ASM), scale, USE_ASM)
        lo_bits = tl.where(lo != lo, 0x7FC0, _bf16_round(lo)).to(tl.uint32)
        hi_bits = tl.where(hi != hi, 0x7FC0, _bf16_round(hi)).to(tl.uint32)
        return lo_bits | (hi_bits << 16)


# Two bf16 elements per uint32 from here on: each helper works on both halves at once, with
# carries that never cross from one half into the other (each half's sum stays below 0x10000).
# (x ^ 0xFFFFFFFF rather than ~x: the CPU interpreter's ~ on uint32 overflows.)


@triton.jit
def _nan_halves(x):
    """Bit 15 (31) set where the low (high) half of x is a bf16 NaN: |h| > 0x7F80, i.e.
    (h & 0x7FFF) + 0x7F reaches 0x8000."""
    return ((x & 0x7FFF7FFF) + 0x007F007F) & 0x80008000


@triton.jit
def _nonzero_halves(x):
    """Bit 15 (31) set where the low (high) half of x is not 0."""
    return (((x & 0x7FFF7FFF) + 0x7FFF7FFF) | x) & 0x80008000


@triton.jit
def _bad_pairs(expected, actual):
    """Pairs with an element that is no match, NaN compared by position: where a NaN is expected,
    any NaN payload matches and nothing else does; elsewhere the bits must be equal (a NaN
    never equals the bits of a non-NaN)."""
    both_nan = _nan_halves(expected) & _nan_halves(actual)
    return (_nonzero_halves(expected ^ actual) & (both_nan ^ 0xFFFFFFFF)) != 0


@triton.jit
def _unlike_pairs(expected):
    """Two 16-bit patterns, each no match for its expected element however many of its two
    bytes a kernel overwrites with the expected bytes: while either byte is left untouched it is
    still no match. Not NaN: every byte complemented. NaN: 0x0000, and 0x00?? / ??00 with a NaN's
    high byte (0x7F, 0xFF) or any low byte are never NaN (their exponent field is not all ones)."""
    nan = (_nan_halves(expected) >> 15) * 0xFFFF  # 0xFFFF in each NaN half
    return (expected | nan) ^ 0xFFFFFFFF  # ~expected where not NaN, 0 where NaN


@triton.jit
def _part(dst_ptr, dst2_ptr, rows, live, dst_stride, dst2_stride, col0, expected, width: tl.constexpr, mode):
    """``width`` element pairs from pair column col0 of ROWS rows, expected pairs ``expected``:
    mode 0 writes _unlike_pairs there (and returns no mismatches); 1 returns where dst is no
    match; 2 also where dst2 is not, or differs from dst by a bit. ``mode`` is a runtime value,
    uniform over the launch: one compiled kernel fills and checks (see _ROWS_LOOSE)."""
    cols = col0 + tl.arange(0, width)
    m = live[:, None]
    ptrs = dst_ptr + rows[:, None] * dst_stride + cols[None, :]
    if mode == 0:
        tl.store(ptrs, _unlike_pairs(expected), mask=m)
        bad = expected != expected
    else:
        actual = tl.load(ptrs, mask=m, other=0)
        bad = _bad_pairs(expected, actual)
        if mode == 2:
            actual2 = tl.load(dst2_ptr + rows[:, None] * dst2_stride + cols[None, :], mask=m, other=0)
            bad = bad | _bad_pairs(expected, actual2) | (actual != actual2)
    return bad & m


# Compile churn: Triton compiles a variant per specialization key, ~0.2 s each on the H200, so every
# key that follows the case (a row count == 1 or % 16, the board slot the flag lands in being 16-byte
# aligned or not) was a compile in the middle of a run that ``mlafuzz warmup`` had not met. What the
# code's speed depends on stays specialized and is the same in every case: the cache and rows are
# 16-byte aligned (contiguous_records, guards) and a row's stride is 288 pairs. The mode (fill, check
# one run, check two) and the host tier are runtime values too: as constexprs they made six variants,
# ~0.65 s each on an H100, in every worker of a cold run. Left: the device's USE_ASM / USE_CVT
# (tests/fast/test_variants.py).
_ROWS_LOOSE = ["total", "mode"]


@triton.jit
def _words(dev_ptr, host_ptr, offs, on_dev, on_host):
    """The words at ``offs`` of each row's record: from the device cache (dev_ptr) where on_dev,
    the host tier's records (host_ptr) where on_host, 0 where neither. A row is in one tier: the
    other load is masked off whole and reads nothing (without a host tier, on_host is all False)."""
    words = tl.load(dev_ptr + offs, mask=on_dev, other=0)
    return words | tl.load(host_ptr + offs, mask=on_host, other=0)


@triton.jit(do_not_specialize=_ROWS_LOOSE, do_not_specialize_on_alignment=["bad_ptr"])
def _rows(
    cache8_ptr,
    host8_ptr,
    rec_ptr,
    dst_bf16_ptr,
    dst2_bf16_ptr,
    bad_ptr,
    total,
    dst_stride,
    dst2_stride,
    mode,
    ROWS: tl.constexpr,
    USE_ASM: tl.constexpr,
    USE_CVT: tl.constexpr,
    SCALE_AT: tl.constexpr,
    ROPE_AT: tl.constexpr,
):
    """ROWS dst rows per program, each rebuilt from its record (rec: byte offsets into the device
    cache; under the host tier, -1 - the offset into its records for a row read from there)
    two elements at a time: one 128-code scale tile at a time (the tile's scale loaded once per
    row), then the 64 RoPE patterns as they are; each slice filled or checked by _part (mode 0 /
    1 / 2). dst_stride, dst2_stride: in element pairs. A mismatch sets bad[0] = 1 with a masked
    store: nothing counted, nothing synchronized across warps."""
    # The records' bytes read as 16- and 32-bit words, the rows as element pairs: pointer casts
    # here rather than typed views on the host (a view costs a few us there).
    cache16_ptr = cache8_ptr.to(tl.pointer_type(tl.int16))
    cache32_ptr = cache8_ptr.to(tl.pointer_type(tl.uint32))
    host16_ptr = host8_ptr.to(tl.pointer_type(tl.int16))
    host32_ptr = host8_ptr.to(tl.pointer_type(tl.uint32))
    dst_ptr = dst_bf16_ptr.to(tl.pointer_type(tl.uint32))
    dst2_ptr = dst2_bf16_ptr.to(tl.pointer_type(tl.uint32))
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rows < total
    raw = tl.load(rec_ptr + rows, mask=live, other=0)
    on_dev = live & (raw >= 0)
    on_host = live & (raw < 0)  # only under the host tier
    raw = tl.where(raw < 0, -1 - raw, raw)
    # Byte offset of each row's record: multiples of 16 (the format's align), said so loads vectorize.
    rec = tl.multiple_of(raw, 16)
    pairs = tl.arange(0, 64)
    nope_bad = tl.zeros((ROWS, 64), dtype=tl.int1)  # the 4 tiles' mismatches, or-ed elementwise
    for t in tl.static_range(4):
        codes = _words(
            cache16_ptr,
            host16_ptr,
            rec[:, None] // 2 + t * 64 + pairs[None, :],
            on_dev[:, None],
            on_host[:, None],
        )
        scale = _words(cache32_ptr, host32_ptr, rec // 4 + SCALE_AT // 4 + t, on_dev, on_host)
        scale = scale.to(tl.float32, bitcast=True)
        expected = _expected_pairs(codes, tl.broadcast_to(scale[:, None], (ROWS, 64)), USE_ASM, USE_CVT)
        nope_bad = nope_bad | _part(dst_ptr, dst2_ptr, rows, live, dst_stride, dst2_stride, t * 64, expected, 64, mode)
    rope_at = rec[:, None] // 4 + ROPE_AT // 4 + tl.arange(0, 32)[None, :]
    rope = _words(cache32_ptr, host32_ptr, rope_at, on_dev[:, None], on_host[:, None])
    rope_bad = _part(dst_ptr, dst2_ptr, rows, live, dst_stride, dst2_stride, 256, rope, 32, mode)
    if mode != 0:
        # Reduced within each row (a row lies in one warp: shuffles, no barrier), so the flag's
        # masked store is one value per row, in the row's own layout.
        row_bad = tl.max(nope_bad.to(tl.int32), axis=1) | tl.max(rope_bad.to(tl.int32), axis=1)
        tl.store(bad_ptr + tl.zeros_like(row_bad), 1, mask=row_bad != 0)


# H200 (.ci/gpu checklab): 4 rows over 2 warps filled at 0.80x of a copy's bandwidth (2 rows, 1
# warp: 0.68x); every config checked at 1.01-1.04x.
ROWS_PER_PROGRAM = 4
NUM_WARPS = 2


# The map's launch takes the case's shapes (row and request counts, a table's strides, the block
# size) and views (seq_starts and the table as slices): specialized, they made a new variant in one
# case of six. A search over a few int32 per row gains nothing from them: none is specialized. Nor
# are seq_starts and the host tier, runtime flags (as constexprs: four variants in every worker).
_MAP_INTS = [
    "total",
    "batch_size",
    "ws_stride",
    "ss_stride",
    "table_s0",
    "table_s1",
    "block_size",
    "has_ss",
    "has_host",
]


_MAP_PTRS = ["ws_ptr", "ss_ptr", "table_ptr", "dmap_ptr", "hmap_ptr", "out_ptr"]


@triton.jit(do_not_specialize=_MAP_INTS, do_not_specialize_on_alignment=_MAP_PTRS)
def _record_map(
    ws_ptr,
    ss_ptr,
    table_ptr,
    dmap_ptr,
    hmap_ptr,
    out_ptr,
    total,
    batch_size,
    ws_stride,
    ss_stride,
    table_s0,
    table_s1,
    block_size,
    has_ss,
    has_host,
    BLOCK: tl.constexpr,
    RECORD_BYTES: tl.constexpr,
):
    """out[row] = byte offset of the record dst row ``row`` reads: row_records, per row. The owner
    is the last request b < batch_size with ws[b] <= row (a right-sided binary search over the
    non-decreasing ws[:B]: past empty requests), its position seq_starts[b] + row - ws[b], then
    the block table. With has_host (SPEC 9.3) the table's slot s picks the tier, the device cache's
    row dmap[s] when that is >= 0, else host row hmap[s], whose offset is stored as -1 - offset
    (read by _rows)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = rows < total
    lo = tl.zeros((BLOCK,), dtype=tl.int64)  # invariant: ws[:lo] <= row < ws[hi:]
    hi = lo + batch_size
    span = batch_size
    while span > 0:  # ceil(log2(B + 1)) halvings for every row at once
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(ws_ptr + mid * ws_stride, mask=active & live, other=0).to(tl.int64)
        right = active & (v <= rows)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
        span = span // 2
    owner = tl.maximum(lo - 1, 0)  # valid cases (ws[0] == 0) give every row an owner
    pos = rows - tl.load(ws_ptr + owner * ws_stride, mask=live, other=0).to(tl.int64)
    # A runtime flag as a mask: broadcast first (the CPU interpreter passes it as a Python int).
    zeros = tl.zeros((BLOCK,), dtype=tl.int32)
    pos += tl.load(ss_ptr + owner * ss_stride, mask=live & ((zeros + has_ss) != 0), other=0).to(tl.int64)
    blk = pos // block_size
    block = tl.load(table_ptr + owner * table_s0 + blk * table_s1, mask=live, other=0).to(tl.int64)
    slot = block * block_size + pos - blk * block_size
    # Without the tier, slot is the device row (d = slot; no map is read).
    tiered = live & ((zeros + has_host) != 0)
    d = tl.where(tiered, tl.load(dmap_ptr + slot, mask=tiered, other=0).to(tl.int64), slot)
    h = tl.load(hmap_ptr + slot, mask=tiered & (d < 0), other=0).to(tl.int64)
    tl.store(out_ptr + rows, tl.where(d >= 0, d * RECORD_BYTES, -1 - h * RECORD_BYTES), mask=live)


def record_offsets(
    *,
    src_cache: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None,
    total: int,
    host_row_ids: torch.Tensor | None = None,
    device_row_ids: torch.Tensor | None = None,
    launchers: Launchers | None = None,
) -> torch.Tensor:
    """Byte offset, int64 [total], of the record each dst row reads in the contiguous cache:
    ``oracles.gather.row_records``'s mapping in one launch (its ten-odd torch ops cost more host
    time than the rest of a fast-path gather check), held equal to it by tests. With the host
    tier's maps (SPEC 9.3, on the cache's device), the oracle's choice of tier per slot: a row
    read from host row h gets -1 - h x 656. Any cache format's: the record stride is the
    cache's last dimension (656 bytes for fp8_ds_mla's). Valid cases only (non-decreasing ws from 0, every slot
    read inside the maps, its host row inside the host cache). A case's offsets are computed once
    and passed to both ``gather_prefill`` and ``gather_rows_flag`` (``rec=``)."""
    dev = src_cache.device
    out = torch.empty(total, dtype=torch.int64, device=dev)
    if total == 0 or batch_size <= 0:
        return out
    ws = workspace_starts.reshape(-1)
    ss = seq_starts.reshape(-1) if seq_starts is not None else ws
    tiered = host_row_ids is not None and device_row_ids is not None
    dmap = device_row_ids.reshape(-1) if tiered else ws  # type: ignore[union-attr]
    hmap = host_row_ids.reshape(-1) if tiered else ws  # type: ignore[union-attr]
    block = 1024
    args = (
        ws,
        ss,
        block_table,
        dmap,
        hmap,
        out,
        total,
        batch_size,
        ws.stride(0),
        ss.stride(0),
        block_table.stride(0),
        block_table.stride(1),
        src_cache.shape[1],
        int(seq_starts is not None),
        int(tiered),
    )
    (launchers or Launchers())(_record_map)(
        -(-total // block),
        args,  # not triton.cdiv: ~5 us a call
        {"BLOCK": block, "RECORD_BYTES": src_cache.shape[-1]},
    )
    return out


def _launch(
    *,
    mode: int,
    cache: torch.Tensor,
    host: torch.Tensor | None,
    dst: torch.Tensor,
    dst2: torch.Tensor | None,
    rec: torch.Tensor,
    bad: torch.Tensor,
    launchers: Launchers | None,
) -> None:
    """``host``: the host tier's records on the device (``host_records``), None without the tier."""
    other = dst2 if dst2 is not None else dst
    total = dst.shape[0]
    dev = dst.device
    with quiet():
        args = (cache, host if host is not None and host.numel() else cache, rec, dst, other, bad, total)
        constexprs = {"ROWS": ROWS_PER_PROGRAM, "USE_ASM": use_asm(dev), "USE_CVT": use_cvt(dev)}
        (launchers or Launchers())(_rows)(
            -(-total // ROWS_PER_PROGRAM),
            (*args, dst.stride(0) // 2, other.stride(0) // 2, mode),
            {**constexprs, "SCALE_AT": _SCALE_AT, "ROPE_AT": _ROPE_AT},
            num_warps=NUM_WARPS,
        )


def contiguous_records(src_cache: torch.Tensor, *, record_bytes: int = RECORD_BYTES) -> torch.Tensor | None:
    """The cache as contiguous, 16-byte aligned uint8 [blocks, bs, 656] (a copy when it is not:
    the typed views of the kernel need the alignment), or None for another shape. Already so:
    the same tensor, no copy (a caller preparing a case once passes the result on).
    ``record_bytes``: another format's record (the nvfp4 check's, harness/fast/nvfp4/gather.py)."""
    cache = src_cache.view(torch.uint8) if src_cache.dtype != torch.uint8 else src_cache
    if cache.dim() != 3 or cache.shape[2] != record_bytes:
        return None
    if not cache.is_contiguous() or cache.data_ptr() % 16:
        cache = cache.clone(memory_format=torch.contiguous_format)
    return cache


def host_records(host_cache: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """The host tier's records (SPEC 9.3: uint8 [rows, 656]) on ``device``, contiguous and 16-byte
    aligned as the kernel reads them; None without a host tier or for another shape. From pinned
    memory the copy is asynchronous: made before the first call (the prefill's), it holds what the
    host cache held then, unless the call wrote the host cache, which the input check sees."""
    if host_cache is None:
        return None
    host = host_cache.view(torch.uint8) if host_cache.dtype != torch.uint8 else host_cache
    if host.dim() != 2 or host.shape[1] != RECORD_BYTES:
        return None
    host = host.to(device, non_blocking=True)
    if not host.is_contiguous() or host.data_ptr() % 16:
        host = host.clone(memory_format=torch.contiguous_format)
    return host


def _tier(
    cache: torch.Tensor | None,
    host_cache: torch.Tensor | None,
    host_row_ids: torch.Tensor | None,
    device_row_ids: torch.Tensor | None,
) -> tuple[torch.Tensor | None] | None:
    """(the host tier's records on the cache's device, or None without a host tier), or None when
    this check does not read the tier as given: given in part, maps of unequal sizes or elsewhere
    than the cache (the kernels read them there), a host cache not [rows, 656]."""
    given = [x is not None for x in (host_cache, host_row_ids, device_row_ids)]
    if cache is None or not any(given):
        return (None,)
    if not all(given):
        return None
    assert host_row_ids is not None and device_row_ids is not None
    if host_row_ids.numel() != device_row_ids.numel() or {host_row_ids.device, device_row_ids.device} != {cache.device}:
        return None
    host = host_records(host_cache, cache.device)
    return (host,) if host is not None else None


def _usable(cache: torch.Tensor | None, *dsts: torch.Tensor | None) -> bool:
    """The layouts this check handles: a cache from ``contiguous_records``, bf16 [total, 576]
    rows with contiguous elements, read two at a time (4-byte aligned rows), on the cache's
    device."""
    return cache is not None and all(
        d is None
        or (
            d.dtype == torch.bfloat16
            and d.dim() == 2
            and d.shape[1] == ROW_DIM
            and d.stride(1) == 1
            and d.stride(0) % 2 == 0
            and d.data_ptr() % 4 == 0
            and d.device == cache.device
        )
        for d in dsts
    )


def gather_prefill(
    *,
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None,
    host_cache: torch.Tensor | None = None,
    host_row_ids: torch.Tensor | None = None,
    device_row_ids: torch.Tensor | None = None,
    rec: torch.Tensor | None = None,
    launchers: Launchers | None = None,
) -> bool:
    """Fill dst so that no byte of it already holds what SPEC section 4 puts there: each element
    is ``_unlike_pairs`` its expected value. Then a dst that ``gather_rows_flag`` finds equal to the
    oracle's was written at every byte, which is what the guards' two-run write map establishes;
    one run and one fill do it. False (nothing written) when the layout is not one it handles.
    The host tier's three arguments (SPEC 9.3) as the gather takes them, or none of them."""
    cache = contiguous_records(src_cache)
    tier = _tier(cache, host_cache, host_row_ids, device_row_ids)
    if batch_size <= 0 or tier is None or not _usable(cache, dst):
        return False
    total = dst.shape[0]
    if total == 0:
        return True
    if rec is None:
        rec = record_offsets(
            src_cache=src_cache,
            block_table=block_table,
            workspace_starts=workspace_starts,
            batch_size=batch_size,
            seq_starts=seq_starts,
            total=total,
            host_row_ids=host_row_ids,
            device_row_ids=device_row_ids,
            launchers=launchers,
        )
    _launch(mode=0, cache=cache, host=tier[0], dst=dst, dst2=None, rec=rec, bad=rec, launchers=launchers)
    return True


def gather_rows_flag(
    *,
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None,
    dst2: torch.Tensor | None = None,
    host_cache: torch.Tensor | None = None,
    host_row_ids: torch.Tensor | None = None,
    device_row_ids: torch.Tensor | None = None,
    rec: torch.Tensor | None = None,
    flag: torch.Tensor | None = None,
    launchers: Launchers | None = None,
) -> torch.Tensor | None:
    """A device int32 [1], nonzero when some dst row (or dst2 row) is not exactly its expected
    dequantized record or dst2 is not bit-identical to dst (NaN payloads included), zero when
    every row is; None when this check cannot tell (a layout it does not read). SPEC section 4's
    preconditions are assumed to hold (the fuzz loop calls it on valid cases only). No host
    synchronization: the caller reads the flag together with its other checks. ``flag``: a zeroed
    int tensor on dst's device to set (its element 0) instead of a new one. The host tier's three
    arguments (SPEC 9.3) as the gather takes them, or none of them."""
    cache = contiguous_records(src_cache)
    tier = _tier(cache, host_cache, host_row_ids, device_row_ids)
    if batch_size <= 0 or tier is None or (dst2 is not None and dst2.shape != dst.shape):
        return None
    if not _usable(cache, dst, dst2):
        return None
    total = dst.shape[0]
    bad = flag if flag is not None else torch.zeros(1, dtype=torch.int32, device=dst.device)
    if total == 0:
        return bad
    if rec is None:
        rec = record_offsets(
            src_cache=src_cache,
            block_table=block_table,
            workspace_starts=workspace_starts,
            batch_size=batch_size,
            seq_starts=seq_starts,
            total=total,
            host_row_ids=host_row_ids,
            device_row_ids=device_row_ids,
            launchers=launchers,
        )
    mode = 1 if dst2 is None else 2
    _launch(mode=mode, cache=cache, host=tier[0], dst=dst, dst2=dst2, rec=rec, bad=bad, launchers=launchers)
    return bad


# --- the fast path's adapters (harness/fast/path.py) -------------------------------


def _args(state: CaseState) -> dict[str, Any]:
    """The fused check's arguments, prepared once per case for its prefill and its checks: the
    cache contiguous and aligned (a copy only when it is not), the host tier's records copied to
    the device (before the first call: the prefill comes first), and the row -> record map."""
    case = state.case
    t = case.tensors
    args = dict(
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
        host_row_ids=t.get("host_row_ids"),
        device_row_ids=t.get("device_row_ids"),
    )
    if "gather" not in state.memo:
        cache = contiguous_records(t["src_cache"])
        tier = _tier(cache, t.get("host_cache"), args["host_row_ids"], args["device_row_ids"])
        rec = (
            record_offsets(src_cache=cache, total=case.params["total"], launchers=state.launchers, **args)
            if cache is not None and tier is not None
            else None
        )  # a layout it does not read: prefill and check decline it themselves
        host = tier[0] if tier is not None else t.get("host_cache")
        state.memo["gather"] = (cache if cache is not None else t["src_cache"], host, rec)
    cache, host, rec = state.memo["gather"]
    return {**args, "src_cache": cache, "host_cache": host, "rec": rec, "launchers": state.launchers}


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    dst = outputs.get("dst")
    dst2 = second.get("dst") if second is not None else None
    if not isinstance(dst, torch.Tensor) or (second is not None and not isinstance(dst2, torch.Tensor)):
        return False
    return gather_rows_flag(dst=dst, dst2=dst2, flag=flag, **_args(state)) is not None


def prefill(case: Case, guards: Mapping[str, Guarded], state: CaseState) -> bool:
    return gather_prefill(dst=guards["dst"].view, **_args(state))
