"""Our Triton nvfp4_ds_mla writer (SPEC.md section 11.3): vLLM's ``concat_and_cache_mla(kv_c,
k_pe, kv_cache, slot_mapping, kv_cache_dtype="nvfp4_ds_mla", scale)`` under the default writer
revision ``rn_bump.mul_recip`` (``oracles.formats.writer_rules``), vLLM's CUDA writer's rules.

Written from the rules, not from the oracles. One program per token; the token's 512 NoPE values
are loaded as their even and odd elements, [32 tiles, 8 pairs] each, so a tile's amax and a
byte's two nibbles need no reshape. Arithmetic is exact where the rules ask for exactness:

- ``amax / 6`` and ``1 / sf`` with ``tl.math.div_rn`` (correctly rounded; Triton's ``/`` on f32
  is the approximate ``div.full.f32`` on CUDA, which lands on the other neighbour of an e2m1 tie);
  ``x * (1 / sf)`` is one f32 multiply, rounded to nearest, as vLLM's CUDA writer does;
- e4m3 rounding on the bits: the quantum of |x| is ``2^max(e - 3, -9)`` (e the f32 exponent),
  ``|x| * 2^-max(e - 3, -9) < 16`` is exact, and ``+ 2^23 - 2^23`` rounds it to an integer, ties to even,
  in f32; saturation is ``min(., 448)`` after rounding (464 would round up to 512);
- e2m1 codes by comparison with the midpoints of neighbouring magnitudes (exact).

A NaN is left out of amax and gets code 0 (its sign dropped); RoPE NaN becomes 0x7F. The host
refuses what the torch writer refuses (``checks.check_writer_args``, a slot past the cache). Two
tokens of one slot race, as in vLLM's CUDA writer (vLLM never maps two tokens to one slot; the
drawn cases don't either).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mlafuzz.kernels.checks import InvalidInputError, check_writer_args
from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.table import get

__all__ = ["writer_nvfp4_triton", "REVISION"]

FORMAT = get("nvfp4_ds_mla")
#: The one writer revision this kernel writes (vLLM's CUDA writer's).
REVISION = writer_rules.DEFAULT
_NOPE, _SCALE, _ROPE = (FORMAT.plane(p) for p in ("nope", "scale", "rope"))


@triton.jit
def _e4m3_round(a):
    """|x| (f32, >= 0, not NaN) -> (e4m3 value rounded to nearest, ties to even, at most 448; its byte)."""
    a = tl.minimum(a, 512.0)  # inf and anything past 464 saturate alike
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    qexp = tl.maximum(e - 3, -9)
    quantum = ((qexp + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - qexp) << 23).to(tl.float32, bitcast=True)
    steps = (a * inverse + 8388608.0) - 8388608.0  # a * inverse: a power of two, exact
    v = tl.minimum(steps * quantum, 448.0)
    vb = v.to(tl.int32, bitcast=True)
    vexp = ((vb >> 23) & 0xFF) - 127
    normal = (vexp + 7) * 8 + ((vb >> 20) & 7)
    sub = (v * 512.0).to(tl.int32)  # below 2^-6: multiples of 2^-9
    return v, tl.where(v < 0.015625, sub, normal)


@triton.jit
def _e4m3_value(code):
    """A positive e4m3 byte (0x01..0x7E) -> its f32 value."""
    exp = code >> 3
    mant = code & 7
    normal = (((exp + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    return tl.where(exp == 0, mant.to(tl.float32) * 0.001953125, normal)


@triton.jit
def _e2m1_code(q):
    """f32 -> e2m1 code: nearest, ties to even, saturating at 6; NaN -> 0."""
    a = tl.abs(q)
    m = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    neg = (q.to(tl.int32, bitcast=True) < 0) & (q == q)
    return m | (neg.to(tl.int32) << 3)


@triton.jit
def _writer_kernel(
    kv_c_ptr,
    k_pe_ptr,
    cache_ptr,
    slot_ptr,
    slots_of_blocks_ptr,
    kv_c_stride0,
    kv_c_stride1,
    k_pe_stride0,
    k_pe_stride1,
    cache_stride0,
    cache_stride1,
    block_size,
    NOPE_OFF: tl.constexpr,
    SCALE_OFF: tl.constexpr,
    ROPE_OFF: tl.constexpr,
    TILES: tl.constexpr,
    PAIRS: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BUMP: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    raw = tl.load(slot_ptr + i).to(tl.int64)
    slot = tl.maximum(raw, 0)
    rec = cache_ptr + (slot // block_size) * cache_stride0 + (slot % block_size) * cache_stride1

    tiles = tl.arange(0, TILES)
    pairs = tl.arange(0, PAIRS)
    elem = tiles[:, None] * (2 * PAIRS) + 2 * pairs[None, :]  # the even element of each byte
    row = kv_c_ptr + i * kv_c_stride0
    mask2 = (elem.to(tl.int64) * 0 + raw) >= 0  # a slot < 0 writes nothing (masks built as tensors)
    xe = tl.load(row + elem * kv_c_stride1, mask=mask2, other=0.0).to(tl.float32)
    xo = tl.load(row + (elem + 1) * kv_c_stride1, mask=mask2, other=0.0).to(tl.float32)

    ae = tl.where(xe == xe, tl.abs(xe), 0.0)
    ao = tl.where(xo == xo, tl.abs(xo), 0.0)
    amax = tl.maximum(tl.max(ae, axis=1), tl.max(ao, axis=1))  # [TILES]
    six = tl.full([TILES], 6.0, tl.float32)
    target = tl.maximum(tl.math.div_rn(amax, six), 0.001953125)
    sval, sf = _e4m3_round(target)
    if BUMP:
        up = (sval < target) & (sf < 0x7E)
        sf = sf + up.to(tl.int32)
        sval = _e4m3_value(sf)
    recip = tl.math.div_rn(tl.full([TILES], 1.0, tl.float32), sval)
    ce = _e2m1_code(xe * recip[:, None])
    co = _e2m1_code(xo * recip[:, None])
    byte = (ce | (co << 4)).to(tl.uint8)
    tl.store(rec + NOPE_OFF + tiles[:, None] * PAIRS + pairs[None, :], byte, mask=mask2)

    place = tl.load(slots_of_blocks_ptr + tiles)  # block s's scale at its permuted byte
    tl.store(rec + SCALE_OFF + place, sf.to(tl.uint8), mask=(tiles.to(tl.int64) * 0 + raw) >= 0)

    r = tl.arange(0, ROPE_DIM)
    pe = tl.load(k_pe_ptr + i * k_pe_stride0 + r * k_pe_stride1, mask=(r.to(tl.int64) * 0 + raw) >= 0, other=0.0).to(
        tl.float32
    )
    _, rc = _e4m3_round(tl.where(pe == pe, tl.abs(pe), 0.0))
    sign = (pe.to(tl.int32, bitcast=True) < 0).to(tl.int32) << 7
    rb = tl.where(pe == pe, rc | sign, 0x7F)
    tl.store(rec + ROPE_OFF + r, rb.to(tl.uint8), mask=(r.to(tl.int64) * 0 + raw) >= 0)


@functools.cache
def _places(device: torch.device) -> torch.Tensor:
    """The scale plane's slot of each element block, on ``device``: made once per device (a fresh
    upload each call was a blocking host-to-device copy)."""
    return torch.tensor(FORMAT.scale_slots, dtype=torch.int32, device=device)


def writer_nvfp4_triton(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "nvfp4_ds_mla",
    scale: torch.Tensor | None = None,
) -> None:
    """Writes token i's record at slot_mapping[i] (>= 0) in place, as the torch writer; refuses
    what it refuses, before launching. ``scale`` is accepted and not read."""
    del scale
    check_writer_args(
        kv_c,
        k_pe,
        kv_cache,
        slot_mapping,
        kv_cache_dtype,
        record_format="nvfp4_ds_mla",
        record_bytes=FORMAT.record_bytes,
    )
    num_blocks, bs, _ = kv_cache.shape
    n = slot_mapping.shape[0]
    if n == 0:
        return
    # One host sync: the largest slot (a negative one is skipped, and below any limit anyway).
    top = int(slot_mapping.max())
    if top >= num_blocks * bs:
        raise InvalidInputError("slot_past_cache", f"slot_mapping max={top} >= {num_blocks * bs}")
    cache = kv_cache.view(torch.uint8)
    if cache.stride(2) != 1:
        raise InvalidInputError("wrong_shape", "kv_cache: a record's bytes must be contiguous")
    places = _places(kv_cache.device)
    _writer_kernel[(n,)](
        kv_c,
        k_pe,
        cache,
        slot_mapping,
        places,
        kv_c.stride(0),
        kv_c.stride(1),
        k_pe.stride(0),
        k_pe.stride(1),
        cache.stride(0),
        cache.stride(1),
        bs,
        NOPE_OFF=_NOPE.offset,
        SCALE_OFF=_SCALE.offset,
        ROPE_OFF=_ROPE.offset,
        TILES=FORMAT.scales,
        PAIRS=FORMAT.scale_block // 2,
        ROPE_DIM=FORMAT.rope_dim,
        BUMP=writer_rules.get(REVISION).rule("scale_rounding") == "rn_bump",
    )
