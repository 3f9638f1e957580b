"""The nvfp4_ds_mla token record (SPEC.md section 11.1): packing and unpacking its planes.

A record is 352 bytes (the format table's row ``nvfp4_ds_mla``):

- bytes ``[0, 256)``: the 512 NoPE values as e2m1 codes, two per byte, byte ``i`` =
  ``code[2i] | code[2i + 1] << 4`` (the even element in the low nibble);
- bytes ``[256, 320)``: the 64 RoPE values as e4m3fn bytes, unscaled;
- bytes ``[320, 352)``: the 32 e4m3fn scales, one per 16 NoPE values; the scale of element block
  ``s`` is at byte ``320 + 8 * (s & 3) + (s >> 2)``.

``Planes`` holds a record's contents in element order: ``codes`` uint8 ``[..., 512]`` (0..15),
``scales`` uint8 ``[..., 32]`` in element-block order (unpermuted), ``rope`` uint8 ``[..., 64]``.
``pack``/``unpack`` are vectorized (any device); ``pack_loop``/``unpack_loop`` walk the bytes
in Python on the CPU, reading every offset from the format table. Both directions are exact
inverses on every record (tests/oracles/formats).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mlafuzz.oracles.formats.table import NVFP4_DS_MLA

__all__ = ["FORMAT", "RECORD_BYTES", "Planes", "as_records", "pack", "pack_loop", "unpack", "unpack_loop"]

FORMAT = NVFP4_DS_MLA
RECORD_BYTES = FORMAT.record_bytes  # 352
_NOPE = FORMAT.plane("nope")
_SCALE = FORMAT.plane("scale")
_ROPE = FORMAT.plane("rope")
#: Block s's scale sits at element SLOTS[s] of the scale plane; INVERSE[p] is the block at slot p.
SLOTS = FORMAT.scale_slots
INVERSE = tuple(SLOTS.index(p) for p in range(len(SLOTS)))


@dataclass(frozen=True, kw_only=True)
class Planes:
    """A record's contents in element order (uint8 each): e2m1 codes [..., 512], e4m3 scales in
    element-block order [..., 32], e4m3 RoPE bytes [..., 64]."""

    codes: Tensor
    scales: Tensor
    rope: Tensor


def as_records(t: Tensor) -> Tensor:
    """A uint8 (or float8 view) tensor ``[..., 352]`` as uint8; TypeError/ValueError otherwise."""
    if t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise TypeError(f"records.dtype={t.dtype}: expected uint8")
    if t.dim() < 1 or t.shape[-1] != RECORD_BYTES:
        raise ValueError(f"records.shape={tuple(t.shape)}: last dim must be {RECORD_BYTES}")
    return t


def _check_planes(codes: Tensor, scales: Tensor, rope: Tensor) -> tuple[int, ...]:
    lead = tuple(codes.shape[:-1])
    for name, t, n in (
        ("codes", codes, _NOPE.elements),
        ("scales", scales, _SCALE.elements),
        ("rope", rope, _ROPE.elements),
    ):
        if t.dtype != torch.uint8 or tuple(t.shape) != lead + (n,):
            raise ValueError(f"{name}: dtype={t.dtype} shape={tuple(t.shape)}, expected uint8 {list(lead) + [n]}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes: an e2m1 code is 0..15, got {int(codes.max())}")
    return lead


def pack(*, codes: Tensor, scales: Tensor, rope: Tensor) -> Tensor:
    """Planes (element order) -> records uint8 ``[..., 352]``, vectorized on the planes' device."""
    lead = _check_planes(codes, scales, rope)
    out = torch.empty(lead + (RECORD_BYTES,), dtype=torch.uint8, device=codes.device)
    out[..., _NOPE.offset : _NOPE.stop] = codes[..., 0::2] | (codes[..., 1::2] << 4)
    out[..., _SCALE.offset : _SCALE.stop] = scales[..., list(INVERSE)]
    out[..., _ROPE.offset : _ROPE.stop] = rope
    return out


def unpack(records: Tensor) -> Planes:
    """Records ``[..., 352]`` -> their planes in element order, vectorized."""
    rec = as_records(records)
    packed = rec[..., _NOPE.offset : _NOPE.stop]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)
    scales = rec[..., _SCALE.offset : _SCALE.stop][..., list(SLOTS)]
    return Planes(codes=codes, scales=scales, rope=rec[..., _ROPE.offset : _ROPE.stop].clone())


def pack_loop(*, codes: Tensor, scales: Tensor, rope: Tensor) -> Tensor:
    """``pack`` byte by byte on the CPU, every offset from the format table."""
    lead = _check_planes(codes, scales, rope)
    c = codes.reshape(-1, _NOPE.elements).tolist()
    s = scales.reshape(-1, _SCALE.elements).tolist()
    r = rope.reshape(-1, _ROPE.elements).tolist()
    out = []
    for ci, si, ri in zip(c, s, r):
        rec = [0] * RECORD_BYTES
        for e, code in enumerate(ci):
            rec[_NOPE.offset + e // 2] |= code << (4 * (e % 2))
        for block, byte in enumerate(si):
            rec[FORMAT.scale_byte(block)] = byte
        for j, byte in enumerate(ri):
            rec[_ROPE.offset + j] = byte
        out.append(rec)
    return torch.tensor(out, dtype=torch.uint8).reshape(lead + (RECORD_BYTES,))


def unpack_loop(records: Tensor) -> Planes:
    """``unpack`` byte by byte on the CPU."""
    rec = as_records(records)
    lead = tuple(rec.shape[:-1])
    codes, scales, rope = [], [], []
    for b in rec.reshape(-1, RECORD_BYTES).cpu().tolist():
        codes.append([(b[_NOPE.offset + e // 2] >> (4 * (e % 2))) & 0xF for e in range(_NOPE.elements)])
        scales.append([b[FORMAT.scale_byte(s)] for s in range(_SCALE.elements)])
        rope.append(b[_ROPE.offset : _ROPE.stop])

    def t(rows: list[list[int]], n: int) -> Tensor:
        return torch.tensor(rows, dtype=torch.uint8).reshape(lead + (n,))

    return Planes(codes=t(codes, _NOPE.elements), scales=t(scales, _SCALE.elements), rope=t(rope, _ROPE.elements))
