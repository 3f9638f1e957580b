"""The nvfp4_ds_mla writer (SPEC.md section 11.3) under each writer revision (``writer_rules``).

For token i with ``slot_mapping[i] >= 0`` the record at that slot becomes, per 16-value tile
``x`` of ``kv_c[i]`` (f32 of the bf16/fp16 value, exact):

- ``amax = max |x_k|`` over the tile's non-NaN values (0 if none: fmaxf from 0, as vLLM's CUDA
  writer reduces);
- ``target = max(amax / 6, 2^-9)`` with ``amax / 6`` one correctly rounded f32 division;
- ``sf = e4m3_rn_satfinite(target)``; under ``scale_rounding = rn_bump``, if ``e4m3(sf) <
  target`` and ``sf < 0x7E`` the next e4m3 byte up (positive e4m3 bytes are ordered like their
  values), under ``rn`` nothing more;
- ``code_k = e2m1_rn_satfinite(q_k)`` with ``q_k = x_k * f32(1 / e4m3(sf))`` (``mul_recip``: two
  f32 roundings) or ``q_k = x_k / e4m3(sf)`` (``div``: one);
- RoPE: ``e4m3_rn_satfinite(k_pe[i, j])`` (saturating at 448; older torch casts gave NaN above 464).

A slot < 0 writes nothing; a repeated slot keeps the later token; a slot past the cache is a
precondition (ValueError). T = len(slot_mapping): kv_c / k_pe may have more rows (CUDA-graph
padding), ignored. Readings: an inf in a tile gives amax = inf, sf = 448 (0x7E, no bump), that
value code +-6 and the others ``x / 448``; a NaN value is left out of amax and gets code 0
(``minifloat``'s reading; NaN is a tagged class outside the writers' common contract).
vLLM's CUDA writer takes bf16 only; the oracle also reads fp16 by value.

``*_loop``: exact scalar arithmetic (``fpbits``) value by value; the others vectorized on
kv_c's device, every division tensor by tensor (torch may turn a division by a Python scalar
into a reciprocal multiply, which is the other revision's quotient).
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Callable, Mapping

import torch
from torch import Tensor

from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.minifloat import (
    E4M3_MAX_CODE,
    e2m1_rn_satfinite,
    e2m1_rn_satfinite_code,
    e4m3_decode,
    e4m3_rn_satfinite,
    e4m3_rn_satfinite_code,
    e4m3_value,
)
from mlafuzz.oracles.formats.nvfp4_record import FORMAT, RECORD_BYTES, as_records, pack, pack_loop
from mlafuzz.oracles.formats.slots import write, write_loop, writer_rows
from mlafuzz.oracles.fpbits import f32_div, f32_mul

__all__ = [
    "SCALE_FLOOR",
    "tile_scale_loop",
    "tile_scales",
    "encode_rows_loop",
    "encode_rows",
    "write_records_loop",
    "write_records",
]

SCALE_FLOOR = 2.0**-9  # the smallest positive e4m3 (subnormal 0x01)
E2M1_MAX = 6.0
_BLOCK = FORMAT.scale_block
_NOPE = FORMAT.nope_dim
_ROPE = FORMAT.rope_dim

#: What each value of rule ``scale_rounding`` does after rounding to nearest: bump or not.
_BUMP: Mapping[str, bool] = MappingProxyType({"rn_bump": True, "rn": False})

#: Rule ``quotient``, scalar (exact f32 arithmetic): q from the value and the scale's value.
_QUOTIENT_LOOP: Mapping[str, Callable[[float, float], float]] = MappingProxyType(
    {"mul_recip": lambda x, s: f32_mul(x, f32_div(1.0, s)), "div": f32_div}
)

#: Rule ``quotient``, tensors (x [..., 16], s [..., 1], both f32 on one device).
_QUOTIENT: Mapping[str, Callable[[Tensor, Tensor], Tensor]] = MappingProxyType(
    {"mul_recip": lambda x, s: x * (torch.ones_like(s) / s), "div": lambda x, s: x / s}
)


# ------------------------------------------------------------------ scalar


def tile_scale_loop(values: list[float], *, scale_rounding: str) -> int:
    """The e4m3 scale byte of one 16-value tile (module docstring), by exact scalar arithmetic."""
    amax = 0.0
    for x in values:
        if x == x:  # fmaxf leaves a NaN out
            amax = max(amax, abs(x))
    target = max(f32_div(amax, E2M1_MAX), SCALE_FLOOR)
    sf = e4m3_rn_satfinite_code(target)
    if _BUMP[scale_rounding] and e4m3_value(sf) < target and sf < E4M3_MAX_CODE:
        sf += 1
    return sf


def encode_rows_loop(*, kv_c: Tensor, k_pe: Tensor, revision: str = writer_rules.DEFAULT) -> Tensor:
    """kv_c [T, 512], k_pe [T, 64] -> records uint8 [T, 352] on the CPU, value by value."""
    rev = writer_rules.get(revision)
    n = writer_rows(kv_c, k_pe, None, fmt=FORMAT)
    quotient = _QUOTIENT_LOOP[rev.rule("quotient")]
    xs = kv_c[:n].cpu().float().tolist()
    pe = k_pe[:n].cpu().float().tolist()
    codes, scales, rope = [], [], []
    for row, rrow in zip(xs, pe):
        row_codes, row_scales = [], []
        for t in range(0, _NOPE, _BLOCK):
            tile = row[t : t + _BLOCK]
            sf = tile_scale_loop(tile, scale_rounding=rev.rule("scale_rounding"))
            row_scales.append(sf)
            row_codes += [e2m1_rn_satfinite_code(quotient(x, e4m3_value(sf))) for x in tile]
        codes.append(row_codes)
        scales.append(row_scales)
        rope.append([e4m3_rn_satfinite_code(r) for r in rrow])

    def t(rows: list[list[int]], width: int) -> Tensor:
        return torch.tensor(rows, dtype=torch.uint8).reshape(n, width)

    return pack_loop(codes=t(codes, _NOPE), scales=t(scales, FORMAT.scales), rope=t(rope, _ROPE))


# ------------------------------------------------------------------ tensors


def tile_scales(*, kv_c: Tensor, revision: str = writer_rules.DEFAULT) -> Tensor:
    """The scale bytes, uint8 [T, 32] in element-block order, of kv_c [T, 512] (vectorized)."""
    rev = writer_rules.get(revision)
    x = kv_c.float().reshape(kv_c.shape[0], FORMAT.scales, _BLOCK)
    absx = x.abs()
    amax = torch.where(torch.isnan(absx), torch.zeros_like(absx), absx).amax(dim=-1)
    target = torch.maximum(amax / torch.full_like(amax, E2M1_MAX), torch.full_like(amax, SCALE_FLOOR))
    sf = e4m3_rn_satfinite(target)
    if _BUMP[rev.rule("scale_rounding")]:
        bump = (e4m3_decode(sf) < target) & (sf < E4M3_MAX_CODE)
        sf = sf + bump.to(torch.uint8)
    return sf


def encode_rows(*, kv_c: Tensor, k_pe: Tensor, revision: str = writer_rules.DEFAULT) -> Tensor:
    """Vectorized ``encode_rows_loop`` on kv_c's device, bit-identical to it."""
    rev = writer_rules.get(revision)
    n = writer_rows(kv_c, k_pe, None, fmt=FORMAT)
    sf = tile_scales(kv_c=kv_c[:n], revision=revision)
    x = kv_c[:n].float().reshape(n, FORMAT.scales, _BLOCK)
    q = _QUOTIENT[rev.rule("quotient")](x, e4m3_decode(sf).unsqueeze(-1))
    codes = e2m1_rn_satfinite(q).reshape(n, _NOPE)
    rope = e4m3_rn_satfinite(k_pe[:n].float()).to(codes.device)
    return pack(codes=codes, scales=sf, rope=rope)


# ------------------------------------------------------------------ the writer over a cache


def _check_cache(kv_cache: Tensor) -> Tensor:
    cache = as_records(kv_cache)
    if cache.dim() != 3:
        raise ValueError(f"kv_cache.shape={tuple(cache.shape)}: expected [num_blocks, bs, {RECORD_BYTES}]")
    return cache


def write_records_loop(
    *, kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, revision: str = writer_rules.DEFAULT
) -> Tensor:
    """A new uint8 cache [num_blocks, bs, 352] (a CPU clone of kv_cache) with every token of a
    slot >= 0 written there, token by token (a later token wins a repeated slot)."""
    writer_rules.get(revision)
    encode = functools.partial(encode_rows_loop, revision=revision)
    return write_loop(
        cache=_check_cache(kv_cache), slot_mapping=slot_mapping, kv_c=kv_c, k_pe=k_pe, fmt=FORMAT, encode=encode
    )


def write_records(
    *, kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, revision: str = writer_rules.DEFAULT
) -> Tensor:
    """Vectorized ``write_records_loop`` on the cache's device, bit-identical to it (``slots.write``:
    a repeated slot resolved to the last token explicitly)."""
    writer_rules.get(revision)
    encode = functools.partial(encode_rows, revision=revision)
    return write(
        cache=_check_cache(kv_cache), slot_mapping=slot_mapping, kv_c=kv_c, k_pe=k_pe, fmt=FORMAT, encode=encode
    )
