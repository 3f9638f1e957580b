"""Pure-Python, bit-level scalar float helpers (no torch).

These are the independent references the codec oracles are checked against:
every rounding here is done on exact integers (a value is a ratio of two
Python ints), so nothing depends on the host FPU, on torch's conversion
kernels or on the C library. They are slow and meant for tiny cases and the
exhaustive tests.

Formats (SPEC.md section 2):

- float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity;
  codes 0x7F and 0xFF are NaN; largest finite 448 (0x7E); smallest subnormal
  2**-9.
- float32: 24-bit significand, emin -126, emax 127.
- bfloat16: 8-bit significand, emin -126, emax 127 (the top half of a
  float32).
"""

from __future__ import annotations

import bisect
import functools
import math
import struct
from fractions import Fraction

__all__ = [
    "FP8_MAX",
    "FLT_MIN",
    "E4M3_NAN_CODE",
    "fp8_e4m3fn_to_f32_bits",
    "f32_rne",
    "f32_mul",
    "f32_div",
    "bf16_rne_bits",
    "f32_bits",
    "e4m3fn_satfinite_code",
]

FP8_MAX = 448.0
FLT_MIN = 2.0**-126
#: The NaN code CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
#: returns for every NaN input, whatever its sign: the software path
#: canonicalises the float NaN to 0x7FFFFFFF (positive) before converting,
#: and the sm_89+ `cvt.rn.satfinite.e4m3x2.f32` gives the canonical 0x7F.
E4M3_NAN_CODE = 0x7F

_BF16_CANONICAL_NAN = 0x7FC0


def fp8_e4m3fn_to_f32_bits(code: int) -> float:
    """Decode one e4m3fn byte to its exact value (a Python float).

    Bit-level: sign = bit 7, exponent = bits 6..3 (bias 7), mantissa = bits
    2..0. Exponent 0 is subnormal (m * 2**-9); exponent 15 with mantissa 7 is
    NaN (e4m3fn has no infinity, so 0x78..0x7E are ordinary finite values up
    to 448). Every value is exact in float32 and in a Python float.
    """
    if not 0 <= code <= 0xFF:
        raise ValueError(f"code={code} is not a byte")
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> 3) & 0xF
    man = code & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    if exp == 0:
        return sign * math.ldexp(man, -9)
    return sign * math.ldexp(8 + man, exp - 7 - 3)


def _round_ratio(num: int, den: int, *, precision: int, emin: int) -> tuple[int, int]:
    """Round the positive rational num/den to `precision` significant bits.

    Returns (r, q) with the rounded value r * 2**q, round to nearest, ties to
    even. Below 2**emin the quantum stays 2**(emin - precision + 1), which is
    exactly gradual underflow (subnormals), never a flush.
    """
    # e = floor(log2(num/den)), found from bit lengths and fixed up by one.
    e = num.bit_length() - den.bit_length()
    if (num << max(0, -e)) < (den << max(0, e)):
        e -= 1
    q = max(e, emin) - (precision - 1)
    if q >= 0:
        n, d = num, den << q
    else:
        n, d = num << -q, den
    r, rem = divmod(n, d)
    if 2 * rem > d or (2 * rem == d and r & 1):
        r += 1
    return r, q


def _round_to_format(x: Fraction, negative: bool, *, precision: int) -> float:
    """Round an exact non-NaN finite value to a binary format with emin -126,
    emax 127 (float32 and bfloat16 share the exponent range)."""
    if x == 0:
        return -0.0 if negative else 0.0
    r, q = _round_ratio(x.numerator, x.denominator, precision=precision, emin=-126)
    # Overflow: the rounded magnitude reached 2**128 (RNE sends everything at
    # or above max + half an ulp there), which is infinity.
    if r.bit_length() + q > 128:
        return -math.inf if negative else math.inf
    value = math.ldexp(r, q)  # exact: r has at most precision+1 bits
    return -value if negative else value


def f32_rne(x: float | Fraction) -> float:
    """Round an exact value to float32, round to nearest even, with gradual
    underflow and overflow to infinity. NaN, infinities and signed zeros
    pass through. Returns the float32 value as a Python float."""
    if isinstance(x, Fraction):
        return _round_to_format(abs(x), x < 0, precision=24)
    if math.isnan(x) or math.isinf(x) or x == 0.0:
        return x
    return _round_to_format(abs(Fraction(x)), x < 0, precision=24)


def f32_mul(a: float, b: float) -> float:
    """IEEE float32 product of two float32 values (SPEC section 2's
    `f32(fp8(code)) * scale`).

    The exact product is formed in rationals (Python's own double product
    would also be exact for a 4-bit times 24-bit significand, but rationals
    keep this obviously correct for any inputs), then rounded once.
    """
    if math.isnan(a) or math.isnan(b):
        return math.nan
    negative = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
    if math.isinf(a) or math.isinf(b):
        if a == 0.0 or b == 0.0:
            return math.nan  # inf * 0 is invalid
        return -math.inf if negative else math.inf
    return _round_to_format(abs(Fraction(a) * Fraction(b)), negative, precision=24)


def f32_div(a: float, b: float) -> float:
    """IEEE float32 quotient a / b of two float32 values, correctly rounded
    (CUDA's `/` on floats without fast-math is div.rn.f32)."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    negative = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
    if math.isinf(a):
        if math.isinf(b):
            return math.nan
        return -math.inf if negative else math.inf
    if math.isinf(b):
        return -0.0 if negative else 0.0
    if b == 0.0:
        if a == 0.0:
            return math.nan
        return -math.inf if negative else math.inf
    return _round_to_format(abs(Fraction(a) / Fraction(b)), negative, precision=24)


def f32_bits(x: float) -> int:
    """The 32-bit pattern of a value that is exactly representable in
    float32 (struct packs it without rounding)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16_rne_bits(x: float) -> int:
    """The bfloat16 bit pattern (0..0xFFFF) of x rounded to nearest even.

    Rounds the exact value of x once to 8 significant bits with gradual
    underflow (bf16 subnormals down to 2**-133, no flush) and overflow to
    infinity; the bits are then read with struct from the float32 that holds
    the bf16 value exactly. This is a value-level rounding, deliberately a
    different method from the `+0x7FFF + lsb` bit trick the vectorized
    oracle uses. NaN gives the canonical quiet NaN 0x7FC0 (SPEC compares NaN
    by position, not payload).
    """
    if math.isnan(x):
        return _BF16_CANONICAL_NAN
    negative = math.copysign(1.0, x) < 0
    if math.isinf(x):
        v = x
    else:
        v = _round_to_format(abs(Fraction(x)), negative, precision=8)
    bits = f32_bits(v)
    if bits & 0xFFFF:
        raise AssertionError(f"bf16 rounding left low bits: x={x!r}")
    return bits >> 16


@functools.lru_cache(maxsize=1)
def _e4m3_finite_values() -> tuple[float, ...]:
    # Codes 0x00..0x7E in order: the non-negative finite values, strictly
    # increasing, so a code's index is its magnitude's rank. Cached because it
    # is a pure constant (an immutable tuple), rebuilt identically if evicted.
    return tuple(fp8_e4m3fn_to_f32_bits(c) for c in range(0x7F))


def e4m3fn_satfinite_code(x: float) -> int:
    """Encode one float32 value as e4m3fn the way CUDA's
    __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does.

    - NaN (any sign, any payload) -> 0x7F (E4M3_NAN_CODE);
    - |x| >= 448, infinities included -> +-448 (0x7E / 0xFE): satfinite;
    - otherwise the nearest of the 127 finite magnitudes, ties to the even
      code (even mantissa), found by exact comparison against the whole
      table, with the sign bit kept (so -0.0 and tiny negatives give 0x80).
    """
    if math.isnan(x):
        return E4M3_NAN_CODE
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a >= FP8_MAX:
        return sign | 0x7E
    values = _e4m3_finite_values()
    fa = Fraction(a)
    lo = bisect.bisect_right(values, a) - 1  # largest code with value <= a
    if values[lo] == a:
        return sign | lo
    hi = lo + 1
    d_lo = fa - Fraction(values[lo])
    d_hi = Fraction(values[hi]) - fa
    if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0):
        return sign | lo
    return sign | hi
