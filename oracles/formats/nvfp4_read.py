"""The nvfp4_ds_mla readers (SPEC.md section 11.2): the exact bf16 reader and the FP8 staging one.

Exact reader (vLLM's CUDA upconvert gather, FlashMLA's SM100 dequant):
``row[c] = bf16(e2m1(code[c]) * e4m3(scale of c's block))`` for c < 512 and
``row[512 + j] = bf16(e4m3(rope[j]))``. For scale bytes 0x01..0x7E the product has at most 6
significant bits and lies in ``[2^-10, 2688]``, so it is exact in f16, f32 and bf16: every way of
computing it (vLLM multiplies in f16, then goes f16 -> f32 -> bf16) gives the same bits. The
other scale bytes are never written by a writer: 0x00 (every product +-0), 0x7F / 0xFF (NaN) and
>= 0x80 (negative). For them only NaN-ness and sign are contract (``loose_mask`` marks those
elements); the oracle still gives the IEEE result (the exact product, sign = xor of the signs,
NaN as the canonical bf16 0x7FC0).

FP8 staging reader (vLLM's Triton path for FlashInfer's SM100 kernel, ``inv_scale`` = 1 / the
kernel's k_scale): each NoPE value becomes ``e4m3_rn_satfinite(clamp(e2m1 * scale * inv_scale,
-448, 448))``: the e2m1 x e4m3 product is exact in f32, the multiply by ``inv_scale`` is one f32
rounding (``inv_scale`` itself is taken as an f32, as Triton passes a Python float), then one
rounding to e4m3. RoPE bytes are copied when ``inv_scale == 1``, else ``e4m3(clamp(rope *
inv_scale, -448, 448))``. Readings: a NaN scale or RoPE byte stages as NaN (0x7F). vLLM's
Triton clamp (``tl.maximum``/``tl.minimum``, NaN propagation left unspecified) may make that NaN
a finite +-448 when compiled (PTX ``max``/``min`` return the non-NaN operand) while the CPU
interpreter keeps it: such bytes are never written, so an element staged from a loose
(``loose_mask``) block is judged on nothing but being there.

``*_loop`` versions compute element by element with exact Python arithmetic (``fpbits``);
the others are vectorized torch on the records' device; the tests hold them bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mlafuzz.oracles.formats.minifloat import (
    e2m1_decode,
    e2m1_value,
    e4m3_decode,
    e4m3_rn_satfinite,
    e4m3_rn_satfinite_code,
    e4m3_value,
)
from mlafuzz.oracles.formats.nvfp4_record import FORMAT, as_records, unpack, unpack_loop
from mlafuzz.oracles.fpbits import FP8_MAX, bf16_rne_bits, f32_mul, f32_rne

__all__ = ["ROW_DIM", "dequant_loop", "dequant", "stage_fp8_loop", "stage_fp8", "loose_mask"]

ROW_DIM = FORMAT.row_dim  # 576
_BLOCK = FORMAT.scale_block  # 16
_BF16_NAN = 0x7FC0


def _bits_to_bf16(bits: list[list[int]], lead: tuple[int, ...]) -> Tensor:
    t = torch.tensor(bits, dtype=torch.int32).reshape(lead + (ROW_DIM,))
    return torch.where(t >= 0x8000, t - 0x10000, t).to(torch.int16).view(torch.bfloat16)


def _clamp_fp8(v: float) -> float:
    # max/min that keep a NaN (Python's max would drop or keep it by argument order).
    return v if math.isnan(v) else min(max(v, -FP8_MAX), FP8_MAX)


# ------------------------------------------------------------------ exact reader


def dequant_loop(records: Tensor) -> Tensor:
    """Records ``[..., 352]`` -> bf16 ``[..., 576]`` element by element on the CPU: the product
    of the two exact values (a Python float multiply, exact for at most 3 x 4 significant bits),
    rounded once to bf16 with ``fpbits.bf16_rne_bits``."""
    p = unpack_loop(records)
    lead = tuple(p.codes.shape[:-1])
    rows = []
    for codes, scales, rope in zip(
        p.codes.reshape(-1, FORMAT.nope_dim).tolist(),
        p.scales.reshape(-1, FORMAT.scales).tolist(),
        p.rope.reshape(-1, FORMAT.rope_dim).tolist(),
    ):
        row = [bf16_rne_bits(e2m1_value(c) * e4m3_value(scales[e // _BLOCK])) for e, c in enumerate(codes)]
        row += [bf16_rne_bits(e4m3_value(r)) for r in rope]
        rows.append(row)
    return _bits_to_bf16(rows, lead)


def _nope_values(codes: Tensor, scales: Tensor) -> Tensor:
    """e2m1 x e4m3 per element, f32 (exact), NoPE shape [..., 512]."""
    sf = e4m3_decode(scales).repeat_interleave(_BLOCK, dim=-1)
    return e2m1_decode(codes) * sf


def _to_bf16(x: Tensor) -> Tensor:
    # Every value here is exact in bf16 (or +-0, or NaN), so the cast does no rounding. NaNs are
    # made the canonical 0x7FC0 the loop version gives, on the bits: torch's CPU cast turns even
    # the f32 0x7FC00000 into 0xFFFF.
    bits = x.to(torch.bfloat16).view(torch.int16).masked_fill(torch.isnan(x), _BF16_NAN)
    return bits.view(torch.bfloat16)


def dequant(records: Tensor) -> Tensor:
    """Vectorized ``dequant_loop`` on the records' device, bit-identical to it."""
    p = unpack(records)
    nope = _nope_values(p.codes, p.scales)
    return torch.cat([_to_bf16(nope), _to_bf16(e4m3_decode(p.rope))], dim=-1)


def loose_mask(records: Tensor) -> Tensor:
    """bool ``[..., 576]``: the elements read through a scale byte no writer makes (0x00, 0x7F,
    >= 0x80), where only NaN-ness and sign are contract; the RoPE columns are never loose."""
    scales = unpack(records).scales
    loose = (scales == 0) | (scales >= 0x7F)
    nope = loose.repeat_interleave(_BLOCK, dim=-1)
    return torch.cat([nope, torch.zeros_like(nope[..., : FORMAT.rope_dim])], dim=-1)


# ------------------------------------------------------------------ FP8 staging reader


def _is_unit(inv_scale: float) -> bool:
    # vLLM decides on the Python float it was given (UNIT_SCALE = inv_scale == 1.0).
    return inv_scale == 1.0


def stage_fp8_loop(records: Tensor, *, inv_scale: float) -> Tensor:
    """Records ``[..., 352]`` -> e4m3fn bytes uint8 ``[..., 576]`` element by element on the CPU."""
    p = unpack_loop(records)
    lead = tuple(p.codes.shape[:-1])
    unit = _is_unit(inv_scale)
    inv = f32_rne(float(inv_scale))
    rows = []
    for codes, scales, rope in zip(
        p.codes.reshape(-1, FORMAT.nope_dim).tolist(),
        p.scales.reshape(-1, FORMAT.scales).tolist(),
        p.rope.reshape(-1, FORMAT.rope_dim).tolist(),
    ):
        row = []
        for e, c in enumerate(codes):
            v = e2m1_value(c) * e4m3_value(scales[e // _BLOCK])  # exact
            if not unit:
                v = f32_mul(v, inv)
            row.append(e4m3_rn_satfinite_code(_clamp_fp8(v)))
        for r in rope:
            row.append(r if unit else e4m3_rn_satfinite_code(_clamp_fp8(f32_mul(e4m3_value(r), inv))))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.uint8).reshape(lead + (ROW_DIM,))


def stage_fp8(records: Tensor, *, inv_scale: float) -> Tensor:
    """Vectorized ``stage_fp8_loop`` on the records' device, bit-identical to it. The multiply by
    ``inv_scale`` is tensor by tensor (never by a Python scalar, which torch may fold otherwise)."""
    rec = as_records(records)
    p = unpack(rec)
    nope = _nope_values(p.codes, p.scales)
    if _is_unit(inv_scale):
        return torch.cat([e4m3_rn_satfinite(nope), p.rope], dim=-1)
    inv = torch.full((), float(inv_scale), dtype=torch.float32, device=rec.device).expand(nope.shape[:-1] + (1,))
    nope = torch.clamp(nope * inv, -FP8_MAX, FP8_MAX)
    rope = torch.clamp(e4m3_decode(p.rope) * inv, -FP8_MAX, FP8_MAX)
    return torch.cat([e4m3_rn_satfinite(nope), e4m3_rn_satfinite(rope)], dim=-1)
