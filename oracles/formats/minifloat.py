"""The two small float codecs of nvfp4_ds_mla (SPEC.md section 11): e2m1 and e4m3fn.

e2m1 (float4): code ``c`` has sign ``c >> 3`` and magnitude ``E2M1_MAGNITUDES[c & 7]`` =
``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``; code 8 is -0. It has no infinity and no NaN.
e4m3fn (float8): ``oracles.fpbits``'s definition (bias 7, no infinity, 0x7F/0xFF NaN, 448 max).

Rounding is round to nearest, ties to the even code (the code whose lowest bit is 0), with
saturation to the largest finite magnitude (``satfinite``: 6 for e2m1, 448 for e4m3, infinities
included), as PTX's ``cvt.rn.satfinite.{e2m1x2,e4m3x2}.f32`` do. The sign is kept, so a negative
value that rounds to zero gives -0 (e2m1 code 8, e4m3 0x80).

NaN inputs: e4m3 gives 0x7F (what CUDA's satfinite conversion returns for any NaN). e2m1 has no
NaN; we give code 0 whatever the NaN's sign (a NaN's sign does not survive the writer's f32
arithmetic reliably: CUDA's canonical NaN is positive, torch's CPU bf16 cast makes a negative one;
FlashMLA's reference keeps the sign bit). That reading is the oracle's, not a contract: SPEC 11.3
keeps a NaN in the writer's input outside the writers' common contract (a tagged class).

Two versions of each: the ``*_code`` / ``*_value`` scalar functions find the nearest value by
brute force over every code with exact rationals (the obviously correct ones; e4m3's are
``fpbits``'s), and the tensor functions use a table of the exact midpoints between neighbouring
magnitudes (``torch.bucketize``), with ties resolved by the parity of the lower code. Both are
exhaustively tested against each other and against torch's float8 cast (tests/oracles/formats).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import torch
from torch import Tensor

from mlafuzz.oracles.fpbits import E4M3_NAN_CODE, e4m3fn_satfinite_code, fp8_e4m3fn_to_f32_bits

__all__ = [
    "E2M1_MAGNITUDES",
    "E2M1_MAX",
    "E4M3_MAX_CODE",
    "E4M3_NAN_CODE",
    "e2m1_value",
    "e2m1_rn_satfinite_code",
    "e2m1_decode",
    "e2m1_rn_satfinite",
    "e4m3_value",
    "e4m3_rn_satfinite_code",
    "e4m3_decode",
    "e4m3_rn_satfinite",
]

#: The magnitude of e2m1 code ``c & 7`` (the sign is bit 3).
E2M1_MAGNITUDES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
#: The largest finite e4m3fn byte (448): where satfinite clamps.
E4M3_MAX_CODE = 0x7E


# ------------------------------------------------------------------ scalar (the definitions)


def e2m1_value(code: int) -> float:
    """The exact value of e2m1 code ``code`` (0..15)."""
    if not 0 <= code <= 15:
        raise ValueError(f"code={code} is not an e2m1 code (0..15)")
    magnitude = E2M1_MAGNITUDES[code & 7]
    return -magnitude if code & 8 else magnitude


def e2m1_rn_satfinite_code(x: float) -> int:
    """The e2m1 code nearest ``x`` (ties to the even code), saturating at 6: brute force over the
    eight codes of ``x``'s sign, distances compared as exact rationals."""
    if math.isnan(x):
        return 0
    sign = 8 if math.copysign(1.0, x) < 0 else 0
    a = Fraction(min(abs(x), E2M1_MAX)) if not math.isinf(x) else Fraction(E2M1_MAX)
    best = min(range(8), key=lambda c: (abs(a - Fraction(E2M1_MAGNITUDES[c])), c & 1))
    return sign | best


def e4m3_value(code: int) -> float:
    """The exact value of e4m3fn byte ``code`` (NaN for 0x7F / 0xFF)."""
    return fp8_e4m3fn_to_f32_bits(code)


def e4m3_rn_satfinite_code(x: float) -> int:
    """The e4m3fn byte of ``x``: nearest, ties to even, saturating at 448, NaN -> 0x7F."""
    return e4m3fn_satfinite_code(x)


# ------------------------------------------------------------------ tensors


def _signed_table(magnitudes: Tensor) -> Tensor:
    return torch.cat([magnitudes, -magnitudes])


@functools.lru_cache(maxsize=8)
def _e2m1_tables(device: torch.device) -> tuple[Tensor, Tensor]:
    # (value of each of the 16 codes, the 7 midpoints between neighbouring magnitudes), f32.
    # Cached per device because they are constants (tensors nobody writes to).
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return _signed_table(mags), (mags[:-1] + mags[1:]) / 2


@functools.lru_cache(maxsize=8)
def _e4m3_midpoints(device: torch.device) -> Tensor:
    # The 126 midpoints between the 127 finite non-negative e4m3 magnitudes (codes 0x00..0x7E,
    # increasing); each has at most 5 significant bits, so it is exact in f32.
    mags = torch.arange(E4M3_MAX_CODE + 1, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).float()
    return (mags[:-1] + mags[1:]) / 2


def e2m1_decode(codes: Tensor) -> Tensor:
    """e2m1 codes (any integer dtype, values 0..15) -> their exact values, float32."""
    values, _ = _e2m1_tables(codes.device)
    return values[codes.long()]


def _nearest_rne(a: Tensor, mids: Tensor) -> Tensor:
    """The index of the nearest magnitude to each non-NaN ``a >= 0`` given the sorted exact
    midpoints between neighbouring magnitudes; at a midpoint, the even index. Past the last
    midpoint the last index: saturation comes for free."""
    up = torch.bucketize(a, mids, right=True)  # number of midpoints <= a
    down = torch.bucketize(a, mids, right=False)  # number of midpoints < a
    on_tie = up != down  # a is exactly the midpoint between `down` and `down + 1`
    return torch.where(on_tie, down + (down & 1), up)


def e2m1_rn_satfinite(x: Tensor) -> Tensor:
    """float32 (or any float) tensor -> e2m1 codes, uint8, ties to even, saturating at 6."""
    x = x.float()
    _, mids = _e2m1_tables(x.device)
    nan = torch.isnan(x)
    a = torch.where(nan, torch.zeros_like(x), x.abs())
    code = _nearest_rne(a, mids) | ((torch.signbit(x) & ~nan).long() << 3)
    return code.to(torch.uint8)


def e4m3_decode(codes: Tensor) -> Tensor:
    """e4m3fn bytes (uint8) -> their exact values, float32 (NaN for 0x7F / 0xFF)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes.dtype={codes.dtype}: expected uint8")
    return codes.contiguous().view(torch.float8_e4m3fn).float()


def e4m3_rn_satfinite(x: Tensor) -> Tensor:
    """float32 (or any float) tensor -> e4m3fn bytes, uint8: nearest, ties to even, saturating at
    448 (infinities included), NaN -> 0x7F."""
    x = x.float()
    nan = torch.isnan(x)
    a = torch.where(nan, torch.zeros_like(x), x.abs())
    code = _nearest_rne(a, _e4m3_midpoints(x.device)) | (torch.signbit(x).long() << 7)
    return torch.where(nan, torch.full_like(code, E4M3_NAN_CODE), code).to(torch.uint8)
