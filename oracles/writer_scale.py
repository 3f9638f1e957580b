"""The writer's per-tile scale rule, by contract revision (SPEC.md sections 2 and 7).

One tile is 128 NoPE values; `amax` is the largest |f32(x)| over its non-NaN
elements (0 if there are none). A revision's ``writer_scale`` rule (its row in
``mlafuzz.oracles.revisions``) says how amax becomes the stored float32 scale;
``SCALE_RULES`` holds each rule's floor and rounding:

- ``flt_min`` (revision 2026-07; vLLM PR #48642, cache_kernels.cu @ 00eb0c874eb5):
  ``scale = max(f32(amax / 448), FLT_MIN)``, stored as is.
- ``pow2_1e-4`` (2026-09 and later; vLLM PR #49435, cache_kernels.cu @ 2a814fefa0e5):
  ``s = max(f32(amax / 448), 1e-4f)`` then ``scale = 2**ceil(log2(s))``,
  and the stored scale is that power of two. vLLM spells the rounding
  ``exp2f(ceilf(log2f(s)))``.

Readings chosen (write them down, SPEC 7 asks for it):

- The power of two is computed EXACTLY on the float32 bits of s: a power of
  two stays, anything above it becomes the next power of two (2**128 would be
  inf; unreachable, since amax <= 3.4e38 gives s < 2**120). fp32 ``log2f`` can
  return the integer k for an s a few ulps above 2**k (then ceil gives 2**k
  where the exact rule gives 2**(k+1)); the oracle follows the exact rule and
  `log2f_may_disagree` names the band so a finding can say so. We assume
  ``log2f(2**k) == k`` and ``exp2f(integer) == 2**integer`` exactly, so powers of
  two themselves are outside the band.
- The band is unreachable from bf16 / fp16 kv_c through this writer: s near a
  power of two needs amax near 7 * 2**m, and the nearest bf16 (fp16) above
  7 * 2**m is 0.45% (0.056%) away, far outside a few ulps of log2. It matters
  for writers that form amax in float32 (e.g. after a fused RMSNorm).
- All-zero and all-NaN tiles: vLLM's fmaxf reduction gives amax 0 resp. NaN;
  ``fmaxf(NaN / 448, floor)`` is the floor either way, so both get FLT_MIN
  (2026-07) or 2**-13 (2026-09: 1e-4f = 0x38D1B717 lies in [2**-14, 2**-13)).
  We take amax over the non-NaN elements with 0 as identity: same scales.
- An infinite amax gives s = inf and scale = inf in both revisions (log2f and
  exp2f of inf are inf), as plain IEEE does.
- fp16 kv_c is read by value in both revisions. vLLM's native writer still
  takes ``fabsf`` of the raw ``uint16_t`` for fp16 at 2a814fefa0e5 (its fp16
  dispatch type), so its fp16 tile scales are wrong under 2026-09 as well;
  a finding, not a reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import Tensor

from mlafuzz.oracles import revisions
from mlafuzz.oracles.fpbits import FLT_MIN, FP8_MAX, f32_bits, f32_div, f32_rne

__all__ = [
    "REVISIONS",
    "NEWEST",
    "SCALE_RULES",
    "ScaleRule",
    "scale_rule",
    "F32_1E_4",
    "LOG2F_BAND_ULPS",
    "check_revision",
    "pow2_ceil_loop",
    "pow2_ceil",
    "prescale_loop",
    "prescale",
    "scale_from_prescale_loop",
    "scale_from_prescale",
    "log2f_may_disagree",
    "log2f_may_disagree_mask",
]

#: The contract revisions, oldest first (SPEC.md section 7): the revision table's names.
REVISIONS: tuple[str, ...] = revisions.names()
#: The revision an implementation is held to unless it names another.
NEWEST: str = revisions.newest()

#: 1e-4f: the float32 nearest 1e-4 (0x38D1B717, 9.99999975e-05), from the exact
#: rational so no host FPU or parser is involved.
F32_1E_4: float = f32_rne(Fraction(1, 10_000))

#: How many float32 ulps (at log2(s)) above an integer count as "log2f may
#: round onto the integer". CUDA documents log2f at 1 ulp; 2 leaves a margin.
LOG2F_BAND_ULPS = 2


@dataclass(frozen=True)
class ScaleRule:
    """One ``writer_scale`` rule: the floor of amax / 448, and whether the result is rounded up
    to a power of two."""

    floor: float
    pow2: bool


#: writer_scale rule value -> its floor and rounding.
SCALE_RULES: dict[str, ScaleRule] = {
    "flt_min": ScaleRule(floor=FLT_MIN, pow2=False),
    "pow2_1e-4": ScaleRule(floor=F32_1E_4, pow2=True),
}


def check_revision(revision: str) -> str:
    """Return `revision` if it is a known one, else raise ValueError naming them."""
    return revisions.check(revision)


def scale_rule(revision: str) -> ScaleRule:
    """The writer_scale rule of `revision` (its row in the revision table)."""
    return SCALE_RULES[revisions.get(revision).rule("writer_scale")]


# ----------------------------------------------------------------- scalar (loop)


def pow2_ceil_loop(s: float) -> float:
    """The smallest power of two >= s, for a non-negative float32 value s.

    Value-level and exact (frexp splits s = m * 2**e with m in [0.5, 1); s is a
    power of two iff m == 0.5), deliberately not the bit trick the vectorized
    version uses. 0 -> 0, inf -> inf, NaN -> NaN; a result of 2**128 or more
    is inf (float32 overflow).
    """
    if math.isnan(s) or math.isinf(s) or s == 0.0:
        return s
    if s < 0:
        raise ValueError(f"s={s!r}: scales are non-negative")
    m, e = math.frexp(s)
    p = s if m == 0.5 else math.ldexp(1.0, e)
    return math.inf if p >= 2.0**128 else p


def prescale_loop(amax: float, *, revision: str) -> float:
    """s of one tile before any power-of-two rounding: max(f32(amax / 448),
    floor) with floor FLT_MIN (2026-07) or 1e-4f (2026-09). amax is never NaN
    (see the module docstring), so the max is plain."""
    return max(f32_div(amax, FP8_MAX), scale_rule(revision).floor)


def scale_from_prescale_loop(s: float, *, revision: str) -> float:
    """The stored float32 scale for prescale s under `revision`."""
    return pow2_ceil_loop(s) if scale_rule(revision).pow2 else s


# ----------------------------------------------------------------- tensors


def pow2_ceil(s: Tensor) -> Tensor:
    """Vectorized `pow2_ceil_loop` on a float32 tensor (any device), on the bits.

    Normal s: a zero mantissa stays, otherwise the exponent field goes up by
    one with the mantissa cleared (exponent 254 + 1 = 255 with mantissa 0 is
    inf: the overflow comes out right by itself). Subnormal s = man * 2**-149:
    the answer is (next power of two >= man) * 2**-149, whose bit pattern is
    that integer (2**23 is 0x00800000 = FLT_MIN, still right). inf, NaN and
    zero keep their bits.
    """
    if s.dtype != torch.float32:
        raise TypeError(f"s.dtype={s.dtype}: expected float32")
    bits = s.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    normal_up = (exp + 1) << 23
    # frexp of a float64 holding man (< 2**23, exact): man is a power of two
    # iff its mantissa is 0.5; otherwise the next one is 2**exponent.
    fm, fe = torch.frexp(man.to(torch.float64))
    sub_up = torch.where(fm == 0.5, man, torch.ones_like(man) << fe.to(torch.int64))
    rounded = torch.where(exp == 0, sub_up, normal_up)
    keep = (man == 0) | (exp == 0xFF)
    out = torch.where(keep, bits, rounded)
    out = torch.where(out >= 0x80000000, out - (1 << 32), out)  # back to signed int32 range
    return out.to(torch.int32).view(torch.float32).reshape(s.shape)


def prescale(amax: Tensor, *, revision: str) -> Tensor:
    """Vectorized `prescale_loop`: float32 amax (NaN-free) -> s, same device.

    The division is tensor / tensor: torch's CUDA division by a CPU scalar
    multiplies by the reciprocal, which is not the correctly rounded quotient
    the CUDA writer computes.
    """
    q = amax / torch.full_like(amax, FP8_MAX)
    return torch.maximum(q, torch.full_like(q, scale_rule(revision).floor))


def scale_from_prescale(s: Tensor, *, revision: str) -> Tensor:
    """Vectorized `scale_from_prescale_loop`."""
    return pow2_ceil(s) if scale_rule(revision).pow2 else s


# ----------------------------------------------------------------- log2f band


def log2f_may_disagree(s_bits: int) -> bool:
    """True when float32 ``exp2f(ceilf(log2f(s)))`` may differ from the exact
    next power of two for the float32 s with bit pattern `s_bits`.

    That happens only just above a power of two: s = 2**k * (1 + tiny), exact
    log2(s) = k + f with a small f > 0, and a log2f that lands on k (within
    its error) makes ceil give k instead of k + 1. We flag s when f is at most
    LOG2F_BAND_ULPS float32 ulps of the value k + f. False for powers of two
    (assumed exact, see the module docstring), zero, negatives, inf and NaN.
    f is computed in float64 from the exact integer significand, which is far
    finer than the band it is compared with.
    """
    s_bits &= 0xFFFFFFFF
    exp, man = (s_bits >> 23) & 0xFF, s_bits & 0x7FFFFF
    if s_bits >> 31 or exp == 0xFF or man == 0:
        return False
    # s = sig * 2**q exactly, sig an integer.
    sig, q = (man, -149) if exp == 0 else (man | 0x800000, exp - 150)
    top = sig.bit_length() - 1
    if sig == 1 << top:
        return False  # a subnormal power of two
    k = top + q
    f = math.log2(sig) - top  # in (0, 1)
    r = k + f
    spacing = math.ldexp(1.0, math.frexp(abs(r))[1] - 1 - 23)
    return f <= LOG2F_BAND_ULPS * spacing


def log2f_may_disagree_mask(s: Tensor) -> Tensor:
    """Vectorized `log2f_may_disagree` on a float32 tensor (bool, same device).

    Same test in float64: frexp gives s = m * 2**e exactly, f = log2(2m).
    """
    if s.dtype != torch.float32:
        raise TypeError(f"s.dtype={s.dtype}: expected float32")
    d = s.to(torch.float64)
    m, e = torch.frexp(d)
    f = torch.log2(2.0 * m)  # exactly 0 for a power of two
    r = (e - 1).to(torch.float64) + f
    _, re = torch.frexp(r.abs())
    spacing = torch.ldexp(torch.ones_like(r), (re - 1 - 23).to(torch.float64))
    ok = torch.isfinite(d) & (d > 0) & (f > 0)
    return ok & (f <= LOG2F_BAND_ULPS * spacing)


def _self_check() -> None:
    # 1e-4f must be the pattern every C compiler produces for the literal.
    assert f32_bits(F32_1E_4) == 0x38D1B717, hex(f32_bits(F32_1E_4))


_self_check()
