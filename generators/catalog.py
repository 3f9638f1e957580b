"""Edge-value catalogs: the fp8 codes, scales and bit patterns hand-written tests skip.

Plain tuples of Python numbers so that specs, strategies and tests can share them
without building tensors.
"""

from __future__ import annotations

import struct

ALL_FP8_CODES: tuple[int, ...] = tuple(range(256))
NAN_FP8_CODES: tuple[int, ...] = (0x7F, 0xFF)  # e4m3fn has no inf; these two are NaN
SUBNORMAL_FP8_CODES: tuple[int, ...] = tuple(range(1, 8)) + tuple(range(0x81, 0x88))
SATURATED_FP8_CODES: tuple[int, ...] = (0x7E, 0xFE)  # +-448

FLT_MIN = 2.0**-126
FLT_TRUE_MIN = 2.0**-149
FLT_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]

# Scales a real writer can produce (positive, >= FLT_MIN) and ones only a
# corrupted or hand-made record holds; both must dequantize exactly.
EXTREME_SCALES: tuple[float, ...] = (
    FLT_MIN,
    FLT_MIN * 3,
    1.0 / 448.0,
    1e-30,
    1e30,
    3e38 / 448.0,
    3.0e38,
    FLT_MAX,
    0.0,
    -0.0,
    -1.0,
    2.0**-133,
    1e-40,
    FLT_TRUE_MIN,
)
# Scales that push |code * scale| into f32/bf16 subnormal range for most codes.
SUBNORMAL_SCALES: tuple[float, ...] = (2.0**-130, 2.0**-135, 2.0**-140, 2.0**-145, 1e-44, FLT_TRUE_MIN)
NONFINITE_SCALES: tuple[float, ...] = (float("nan"), float("inf"), float("-inf"))

# bf16 bit patterns for the rope part: NaNs with payloads and signs, infinities,
# subnormals. The rope is copied bit for bit, so all of these must survive.
ROPE_SPECIAL_BITS: tuple[int, ...] = (0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x0000, 0x8000)

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
