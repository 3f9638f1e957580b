"""Floats from bit patterns: the shared helpers of the device-exact builders.

Every float the fillers make is assembled from integer fields (sign,
exponent, mantissa) or looked up in a table of bit patterns that Python
computed on the host (struct, exact integer rounding). No float arithmetic
runs on the device, so there is nothing that could round, flush or fuse
differently on two devices; the only float ops anywhere are inside the
writer oracle ``encode_rows``, which is exact IEEE by its own contract.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import torch
from torch import Tensor

from mlafuzz.oracles.fpbits import bf16_rne_bits

Device = torch.device | str

# floor(log2 |x|) of a standard normal, in 256ths (the exact probabilities are
# 0.045, 0.272, 0.300, 0.186, 0.098, ...); e = 3 and e = -10 are kept once each
# so that a pool has the odd outlier and the odd tiny value, as activations do.
_NORMAL_EXPONENTS: tuple[tuple[int, int], ...] = (
    (3, 1),
    (2, 1),
    (1, 12),
    (0, 69),
    (-1, 76),
    (-2, 47),
    (-3, 25),
    (-4, 13),
    (-5, 6),
    (-6, 3),
    (-7, 1),
    (-8, 1),
    (-10, 1),
)
assert sum(c for _, c in _NORMAL_EXPONENTS) == 256


@dataclass(frozen=True)
class HalfFormat:
    """A 16-bit float format: bfloat16 or float16."""

    name: str  # used in stream names: stable, unlike str(dtype) might be
    dtype: torch.dtype
    bias: int
    mbits: int
    ebits: int

    @property
    def max_field(self) -> int:  # the largest finite binade's exponent field
        return (1 << self.ebits) - 2


BF16 = HalfFormat("bf16", torch.bfloat16, 127, 7, 8)
FP16 = HalfFormat("fp16", torch.float16, 15, 10, 5)
FORMATS = {torch.bfloat16: BF16, torch.float16: FP16}


@functools.lru_cache(maxsize=256)
def const(values: tuple[int, ...], device: str, dtype: torch.dtype = torch.int64) -> Tensor:
    """A small constant table on device, made once per (values, device)."""
    return torch.tensor(values, dtype=dtype, device=device)


def normal_exponent_table(device: Device) -> Tensor:
    return const(tuple(e for e, c in _NORMAL_EXPONENTS for _ in range(c)), str(torch.device(device)))


def half_bits(sign: Tensor, exp: Tensor, mant: Tensor, fmt: HalfFormat) -> Tensor:
    """16-bit patterns (int64 in [0, 2**16)) of (-1)**sign * 1.mant * 2**exp.

    Saturates to the largest finite binade above the format's range and
    becomes subnormal (by a truncating shift) or zero below it: this builds
    random values, it rounds nothing, so any pattern it picks is a fine one.
    """
    biased = torch.clamp(exp + fmt.bias, max=fmt.max_field)
    shift = torch.clamp(1 - biased, min=0, max=fmt.mbits + 1)
    mant = torch.where(biased >= 1, mant, (mant | (1 << fmt.mbits)) >> shift)
    return (sign << 15) | (torch.clamp(biased, min=0) << fmt.mbits) | mant


def normal_fields(words: Tensor, fmt: HalfFormat) -> tuple[Tensor, Tensor, Tensor]:
    """(sign, exponent, mantissa) of N(0, 1)-like values from 32-bit words.

    Bits used: 0..mbits-1 mantissa, 16..23 the exponent pick, 31 the sign.
    Bits 10..15 and 24..30 are left for the caller's own choices.
    """
    exp = normal_exponent_table(words.device)[(words >> 16) & 0xFF]
    return (words >> 31) & 1, exp, words & ((1 << fmt.mbits) - 1)


def normal_bits(words: Tensor, fmt: HalfFormat) -> Tensor:
    return half_bits(*normal_fields(words, fmt), fmt)


def pick(field: Tensor, bits: int, n: int) -> Tensor:
    """Index in [0, n) from a ``bits``-wide random field (multiply-shift, exact)."""
    return (field * n) >> bits


def to_half(bits: Tensor, dtype: torch.dtype) -> Tensor:
    """16-bit patterns (int64 in [0, 2**16)) -> a bf16/fp16 tensor with those bits."""
    return ((bits ^ 0x8000) - 0x8000).to(torch.int16).view(dtype)


def f32_pattern(value: float) -> int:
    """The float32 bit pattern of a Python float, as a signed int32 (host-side, exact)."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def half_pattern(value: float, fmt: HalfFormat) -> int:
    """The 16-bit pattern of a Python float in fmt, round to nearest even, inf on overflow."""
    if fmt is BF16:
        return bf16_rne_bits(value)
    try:
        return struct.unpack("<H", struct.pack("<e", value))[0]  # '<e' rounds half to even
    except OverflowError:
        return 0x7C00 | (0x8000 if value < 0 else 0)
