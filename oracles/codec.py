"""Oracle for the fp8_ds_mla token record: dequant and writer (SPEC.md section 2).

Record layout (656 bytes): bytes 0..511 are 512 e4m3fn codes in four tiles of
128, bytes 512..527 four little-endian float32 scales (one per tile), bytes
528..655 the 64 RoPE values as raw bf16 bit patterns.

Two versions of everything: `*_loop` walks elements in Python and does all
rounding with the integer-exact helpers of `fpbits` (obviously correct, slow,
for tiny cases); the unsuffixed version is vectorized torch that runs on the
device of its inputs and does its roundings by integer bit manipulation, so
that it does not depend on how a given torch build converts to bf16 / fp8 on
a given device. The property tests hold the two bit for bit.

Readings chosen where SPEC is silent:

- Output NaNs are the canonical bf16 quiet NaN 0x7FC0, whatever the input
  payload or sign (SPEC compares NaN by position only).
- Writer NaN input -> code 0x7F for either sign: what CUDA's
  `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)` returns (its software
  path canonicalises the NaN to +NaN first; the sm_89+ cvt instruction gives
  the canonical 0x7F too).
- Writer inf input: amax = inf, scale = inf / 448 = inf (stored as is), the
  inf element gives inf/inf = NaN -> 0x7F, finite elements of that tile give
  x/inf = +-0 -> 0x00 / 0x80. Plain IEEE, as the CUDA kernel does.
- Writer scale rule: per contract revision (SPEC section 7), keyword
  `revision` on every writer function, default NEWEST ("2026-09"); the rule
  and its readings (exact power of two, the log2f band, all-zero / all-NaN
  tiles) live in `writer_scale`. "2026-07" is SPEC section 2 as written:
  max(amax / 448, FLT_MIN), not rounded.
- Writer all-NaN tile: vLLM's fmaxf reduction yields amax = NaN there, and
  `fmaxf(NaN / 448, floor)` = floor; we compute amax over the non-NaN
  elements with 0 as the identity, which gives the same scale (FLT_MIN in
  2026-07, 2**-13 in 2026-09).
- Writer codes: e4m3fn(f32(x) / scale), a true division as vLLM's
  scaled_convert does (not a multiply by 1/scale); with a power-of-two
  scale the quotient is exact, so only the fp8 rounding remains.
- Writer fp16 k_pe: the 16-bit patterns are copied raw, not converted: vLLM's
  kernel moves k_pe as opaque 32-bit words into the 16-bit rope slots, so an
  fp16 k_pe lands as fp16 bits that the dequant then reads as bf16. SPEC's
  "copied (as bf16 bits)" is read as "copied bit for bit".
- Writer duplicate slots (a race in a real kernel): the later token wins.
- Writer token count: T = len(slot_mapping), as vLLM's launcher does; kv_c and
  k_pe may have more rows (CUDA-graph padding), the extra rows are ignored.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import torch
from torch import Tensor

from mlafuzz.oracles.formats import table as formats_table
from mlafuzz.oracles.formats.slots import write, write_loop, writer_rows
from mlafuzz.oracles.fpbits import (
    E4M3_NAN_CODE,
    FLT_MIN,
    FP8_MAX,
    bf16_rne_bits,
    e4m3fn_satfinite_code,
    f32_bits,
    f32_div,
    f32_mul,
    fp8_e4m3fn_to_f32_bits,
)
from mlafuzz.oracles.writer_scale import (
    NEWEST,
    REVISIONS,
    check_revision,
    prescale,
    prescale_loop,
    scale_from_prescale,
    scale_from_prescale_loop,
)

__all__ = [
    "RECORD_BYTES",
    "NOPE_DIM",
    "ROPE_DIM",
    "TILE",
    "ROW_DIM",
    "FP8_MAX",
    "FLT_MIN",
    "E4M3_NAN_CODE",
    "REVISIONS",
    "NEWEST",
    "TileScales",
    "tile_scales",
    "fp8_e4m3fn_to_f32_bits",
    "bf16_rne_bits",
    "as_record_bytes",
    "dequant_records_loop",
    "dequant_records",
    "encode_rows_loop",
    "encode_rows",
    "write_records_loop",
    "write_records",
]

# The layout's numbers are the format table's (oracles.formats.table), named here for the code below.
FORMAT = formats_table.get("fp8_ds_mla")
RECORD_BYTES = FORMAT.record_bytes  # 656
NOPE_DIM = FORMAT.nope_dim  # 512
ROPE_DIM = FORMAT.rope_dim  # 64
TILE = FORMAT.scale_block  # 128
ROW_DIM = FORMAT.row_dim  # 576
N_TILES = FORMAT.scales  # 4
SCALE_OFF = FORMAT.plane("scale").offset  # 512
ROPE_OFF = FORMAT.plane("rope").offset  # 528

_BF16_NAN = 0x7FC0


def as_record_bytes(t: Tensor) -> Tensor:
    """View a uint8 or float8_e4m3fn tensor as uint8 (same bytes, no copy)."""
    if t.dtype == torch.uint8:
        return t
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    raise TypeError(f"records.dtype={t.dtype}: expected uint8 or float8_e4m3fn")


def _check_last_dim(t: Tensor, size: int, name: str) -> None:
    if t.dim() < 1 or t.shape[-1] != size:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: last dim must be {size}")


def _bits16_to_bf16(bits: Tensor) -> Tensor:
    """int64 tensor of 16-bit patterns (0..0xFFFF) -> bfloat16 tensor."""
    signed = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return signed.to(torch.int16).view(torch.bfloat16)


# ----------------------------------------------------------------- dequant


def dequant_records_loop(records: Tensor) -> Tensor:
    """Dequantize records [..., 656] -> bf16 [..., 576], element by element.

    SPEC section 2 "Dequantized row", literally: for e < 512,
    row[e] = bf16_rne(f32(fp8(code[e])) * scale[e // 128]) with the float32
    product rounded first and then rounded again to bf16 (two roundings),
    subnormals kept; row[512 + j] = rope[j] bit for bit. Scales are read with
    struct as little-endian float32. Returns a CPU tensor.
    """
    rec = as_record_bytes(records)
    _check_last_dim(rec, RECORD_BYTES, "records")
    lead = tuple(rec.shape[:-1])
    flat = rec.reshape(-1, RECORD_BYTES).cpu().tolist()
    out_bits: list[list[int]] = []
    for b in flat:
        scales = struct.unpack("<4f", bytes(b[SCALE_OFF:ROPE_OFF]))
        row = []
        for e in range(NOPE_DIM):
            value = fp8_e4m3fn_to_f32_bits(b[e])
            row.append(bf16_rne_bits(f32_mul(value, scales[e // TILE])))
        for j in range(ROPE_DIM):
            row.append(b[ROPE_OFF + 2 * j] | (b[ROPE_OFF + 2 * j + 1] << 8))
        out_bits.append(row)
    bits = torch.tensor(out_bits, dtype=torch.int64).reshape(*lead, ROW_DIM)
    return _bits16_to_bf16(bits)


def _f32_to_bf16_bits(x: Tensor) -> Tensor:
    """float32 -> bf16 bit patterns (int64, 0..0xFFFF), round to nearest even.

    The classic bit trick: add 0x7FFF plus the lowest kept bit, then drop 16
    bits; it is exact RNE for normals, subnormals (the carry walks into the
    exponent as it should) and overflow to inf. Done in int64 so no sign or
    overflow trouble; NaN is special-cased to 0x7FC0 because the trick could
    turn a low-payload NaN into inf.
    """
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return torch.where(is_nan, torch.full_like(rounded, _BF16_NAN), rounded & 0xFFFF)


def _f32_to_bf16(x: Tensor) -> Tensor:
    """`_f32_to_bf16_bits` as a bfloat16 tensor, in int32 (half the bytes of int64, and no
    int64 -> int16 narrowing): the trick on the magnitude, which cannot overflow int32 for any
    non-NaN (at most 0x7F800000 + 0x8000), then the sign as the int16's own: a negative value's
    bits ``0x8000 | r`` are the int16 ``r - 0x8000``. NaN is 0x7FC0 as there (no ``torch.where``:
    several times slower on the CPU than these elementwise ops).
    tests/oracles/test_codec.py holds the two equal on every class of f32 bit pattern."""
    bits = x.contiguous().view(torch.int32)
    mag = bits & 0x7FFFFFFF
    rounded = (mag + 0x7FFF + ((mag >> 16) & 1)) >> 16  # 0 .. 0x7F80 for a non-NaN
    signed = rounded - ((bits >> 16) & 0x8000)  # the arithmetic shift brings the sign to bit 15
    return signed.masked_fill_(mag > 0x7F800000, _BF16_NAN).to(torch.int16).view(torch.bfloat16)


def dequant_records(records: Tensor) -> Tensor:
    """Vectorized dequant of records [..., 656] -> bf16 [..., 576] on the
    records' device; bit-identical to `dequant_records_loop` (SPEC section 2).

    fp8 -> f32 is torch's exact e4m3fn decode; the product is one IEEE f32
    tensor multiply (no fused op, no scalar-reciprocal path: both operands
    are tensors); bf16 rounding is `_f32_to_bf16` (`_f32_to_bf16_bits`'s
    trick); the rope half is the records' own 16-bit words, viewed as bf16.
    Subnormals are kept on CPU as long as `torch.set_flush_denormal(True)`
    has not been called, and always on CUDA (torch is built without fast-math).
    """
    rec = as_record_bytes(records)
    _check_last_dim(rec, RECORD_BYTES, "records")
    lead = tuple(rec.shape[:-1])
    flat = rec.reshape(-1, RECORD_BYTES)
    n = flat.shape[0]
    codes = flat[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scales = flat[:, SCALE_OFF:ROPE_OFF].contiguous().view(torch.float32)
    prod = codes.reshape(n, N_TILES, TILE) * scales.reshape(n, N_TILES, 1)
    nope = _f32_to_bf16(prod.reshape(n, NOPE_DIM))
    rope = flat[:, ROPE_OFF:].contiguous().view(torch.bfloat16)
    return torch.cat([nope, rope], dim=1).reshape(*lead, ROW_DIM)


# ----------------------------------------------------------------- encoder


def encode_rows_loop(*, kv_c: Tensor, k_pe: Tensor, revision: str = NEWEST) -> Tensor:
    """Encode tokens into records, element by element (SPEC section 2 "Writer").

    Per tile: amax = max |f32(x)| over non-NaN elements (0 if none), s =
    max(f32(amax / 448), floor), scale = s (2026-07) or the power of two at or
    above s (2026-09), code = satfinite_e4m3fn(f32(x / scale)) -- two
    roundings, the f32 division then the fp8 conversion. Rope: the raw
    16-bit patterns of k_pe. Returns uint8 [T, 656] on the CPU.
    """
    check_revision(revision)
    n = writer_rows(kv_c, k_pe, None, fmt=FORMAT)
    xs = kv_c.cpu().to(torch.float32).tolist()  # bf16/fp16 -> f32 is exact
    pe = k_pe.cpu().contiguous().view(torch.int16).tolist()
    out: list[list[int]] = []
    for i in range(n):
        codes: list[int] = []
        scale_bytes = b""
        for t in range(N_TILES):
            tile = xs[i][t * TILE : (t + 1) * TILE]
            amax = 0.0
            for x in tile:
                if x == x:  # fmaxf ignores NaN
                    amax = max(amax, abs(x))
            s = prescale_loop(amax, revision=revision)  # amax/448 is never NaN
            scale = scale_from_prescale_loop(s, revision=revision)
            scale_bytes += struct.pack("<I", f32_bits(scale))
            codes.extend(e4m3fn_satfinite_code(f32_div(x, scale)) for x in tile)
        rope = b"".join(struct.pack("<H", v & 0xFFFF) for v in pe[i])
        out.append(codes + list(scale_bytes) + list(rope))
    return torch.tensor(out, dtype=torch.uint8).reshape(n, RECORD_BYTES)


def _f32_to_e4m3fn_satfinite(y: Tensor) -> Tensor:
    """float32 tensor -> e4m3fn codes (uint8) with RNE and satfinite.

    Bit manipulation in int64 so the result is the same on every device (the
    torch float8 cast saturates on this CPU build but is not documented to,
    and does not canonicalise NaN). Normal range (|y| >= 2**-6): round the
    f32 significand to 3 bits with the `+ (half - 1) + lsb` trick and rebias
    the exponent (127 -> 7). Subnormal range: m = round_half_even(|y| * 512),
    exact because scaling by 2**9 is exact. |y| is clamped to 448 first,
    which equals RNE-then-saturate since rounding is monotone.
    """
    bits = y.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    sign = (bits >> 31) & 1
    a = torch.clamp(y.abs(), max=FP8_MAX)  # +inf -> 448 (NaN handled below)
    a = torch.where(is_nan, torch.zeros_like(a), a)
    abits = a.view(torch.int32).to(torch.int64)
    normal_code = ((abits + 0x7FFFF + ((abits >> 20) & 1)) >> 20) - (120 << 3)
    sub_code = torch.round(a * 512.0).to(torch.int64)  # torch.round is half-to-even
    code = torch.where(a >= 2.0**-6, normal_code, sub_code) | (sign << 7)
    code = torch.where(is_nan, torch.full_like(code, E4M3_NAN_CODE), code)
    return code.to(torch.uint8)


@dataclass(frozen=True, kw_only=True)
class TileScales:
    """Per-tile scale steps of the writer, float32 [T, 4] each, on kv_c's device.

    amax: max |f32(x)| over the tile's non-NaN elements (0 if none);
    prescale: s = max(f32(amax / 448), floor), before any power-of-two
    rounding (feed it to `writer_scale.log2f_may_disagree_mask` to name a
    log2f-band finding); scale: what the record stores.
    """

    amax: Tensor
    prescale: Tensor
    scale: Tensor


def tile_scales(*, kv_c: Tensor, revision: str = NEWEST) -> TileScales:
    """The writer's scale steps for kv_c [T, 512] (bf16 or fp16) under `revision`."""
    check_revision(revision)
    if kv_c.dim() != 2 or kv_c.shape[1] != NOPE_DIM:
        raise ValueError(f"kv_c.shape={tuple(kv_c.shape)}: expected [T, {NOPE_DIM}]")
    absx = kv_c.to(torch.float32).reshape(-1, N_TILES, TILE).abs()
    amax = torch.where(torch.isnan(absx), torch.zeros_like(absx), absx).amax(dim=2)
    s = prescale(amax, revision=revision)
    return TileScales(amax=amax, prescale=s, scale=scale_from_prescale(s, revision=revision))


def encode_rows(*, kv_c: Tensor, k_pe: Tensor, revision: str = NEWEST) -> Tensor:
    """Vectorized encoder: kv_c [T, 512], k_pe [T, 64] (bf16 or fp16) ->
    uint8 records [T, 656] on kv_c's device; bit-identical to
    `encode_rows_loop` (SPEC section 2 "Writer", section 7 for `revision`).

    Divisions are tensor / tensor, never tensor / Python scalar: torch's
    CUDA div by a CPU scalar multiplies by the reciprocal, which is not the
    correctly rounded quotient the CUDA kernel computes.
    """
    check_revision(revision)
    n = writer_rows(kv_c, k_pe, None, fmt=FORMAT)
    x = kv_c.to(torch.float32).reshape(n, N_TILES, TILE)
    scale = tile_scales(kv_c=kv_c[:n], revision=revision).scale
    codes = _f32_to_e4m3fn_satfinite(x / scale.unsqueeze(2)).reshape(n, NOPE_DIM)
    scale_bytes = scale.contiguous().view(torch.uint8).reshape(n, 4 * N_TILES)
    rope_bytes = k_pe.contiguous().view(torch.uint8).reshape(n, 2 * ROPE_DIM)
    return torch.cat([codes, scale_bytes, rope_bytes.to(codes.device)], dim=1)


# ----------------------------------------------------------------- writer


def _check_cache(kv_cache: Tensor) -> Tensor:
    cache = as_record_bytes(kv_cache)
    if cache.dim() != 3 or cache.shape[2] != RECORD_BYTES:
        raise ValueError(f"kv_cache.shape={tuple(cache.shape)}: expected [num_blocks, bs, 656]")
    return cache


def write_records_loop(
    *,
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    revision: str = NEWEST,
) -> Tensor:
    """Writer oracle, token by token (SPEC section 2 "Writer").

    Returns a NEW uint8 cache [num_blocks, bs, 656] (a clone of kv_cache, on
    the CPU) where every token i with slot_mapping[i] >= 0 has its record at
    block slot // bs, offset slot % bs; tokens with a negative slot write
    nothing. Later tokens overwrite earlier ones at a repeated slot. Raises
    ValueError for a slot past the cache (a precondition, not a result), or
    for an unknown `revision` (SPEC section 7; the default is the newest).

    ``skip_scale`` (vLLM 0.33.0 on; passed as ``k_scale == 1.0``) only skips the plain fp8
    path's division by the global ``scale``, which this dtype never makes: it changes no byte
    of these records (docs/contract.md, Writer; what 0.34.0's wheel shows of it too).
    """
    check_revision(revision)
    encode = functools.partial(encode_rows_loop, revision=revision)
    return write_loop(
        cache=_check_cache(kv_cache), slot_mapping=slot_mapping, kv_c=kv_c, k_pe=k_pe, fmt=FORMAT, encode=encode
    )


def write_records(
    *,
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    revision: str = NEWEST,
) -> Tensor:
    """Vectorized writer: same contract as `write_records_loop`, on the
    cache's device, bit-identical to it. Repeated slots are resolved to the
    last token explicitly (index_put with duplicates is unordered on CUDA).
    """
    check_revision(revision)
    encode = functools.partial(encode_rows, revision=revision)
    return write(
        cache=_check_cache(kv_cache), slot_mapping=slot_mapping, kv_c=kv_c, k_pe=k_pe, fmt=FORMAT, encode=encode
    )
