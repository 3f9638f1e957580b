"""The cache formats (SPEC.md sections 2 and 11.1) as data: one frozen row per format.

A format row is the one place that knows a token record's layout: its size, its planes (the
NoPE values, their scales, the RoPE values) with each plane's byte range, element count and
codec, the width of the dequantized row every reader produces, and the alignment facts a
kernel may rely on. Code asks the row (``get("nvfp4_ds_mla").plane("scale").offset``) instead of
spelling 656 or 352; FlashMLA tells the formats apart by bytes per token, so ``by_record_bytes``
does too.

Codecs, by name (the oracles in this folder and ``oracles.codec`` implement them):

- ``e4m3fn``: one float8 e4m3fn byte per element (bias 7, no infinity, 0x7F/0xFF NaN).
- ``e2m1x2``: float4 e2m1, two elements per byte, the even element in the low nibble.
- ``f32_le``: one little-endian IEEE float32 per element (4 bytes).
- ``bf16_bits``: one little-endian bfloat16 bit pattern per element (2 bytes), copied as is.

Importable without torch and by every layer: it imports nothing of mlafuzz, and the
no-borrowing import contract (pyproject.toml) lets our kernels read it, as they read
``oracles.revisions``: the layout is the contract's data, not reference code.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

__all__ = ["CODEC_BITS", "Plane", "Format", "FORMATS", "get", "names", "by_record_bytes"]

#: Bits per element of each codec: what a plane's byte count is checked against.
CODEC_BITS: Mapping[str, int] = MappingProxyType({"e4m3fn": 8, "e2m1x2": 4, "f32_le": 32, "bf16_bits": 16})

#: The plane names every format has, in this order (not necessarily their byte order).
PLANE_NAMES = ("nope", "scale", "rope")


@dataclass(frozen=True, kw_only=True)
class Plane:
    """One part of a token record: bytes ``[offset, offset + nbytes)`` hold ``elements`` values
    in ``codec``."""

    name: str
    offset: int
    nbytes: int
    elements: int
    codec: str

    @property
    def stop(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True, kw_only=True)
class Format:
    """One cache format. ``scale_block`` NoPE elements share a scale; the scale of element block
    ``s`` (elements ``[s * scale_block, (s + 1) * scale_block)``) is element ``scale_slots[s]``
    of the scale plane (the identity for fp8_ds_mla, nvfp4's 8x4 transpose for nvfp4_ds_mla).
    ``row_dim`` is the width of the bf16 row a reader makes (NoPE then RoPE); ``align`` the
    vector width in bytes that divides ``record_bytes``, so a vector access of a record is
    aligned when the cache is."""

    name: str
    record_bytes: int
    planes: tuple[Plane, ...]
    scale_block: int
    scale_slots: tuple[int, ...]
    row_dim: int
    align: int
    source: str  # where the layout is written upstream

    def __post_init__(self) -> None:
        where = f"format {self.name}"
        if tuple(p.name for p in self.planes) != PLANE_NAMES:
            raise ValueError(f"{where}: planes={[p.name for p in self.planes]}, expected {list(PLANE_NAMES)}")
        spans = sorted((p.offset, p.stop) for p in self.planes)
        if spans[0][0] != 0 or spans[-1][1] != self.record_bytes or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
            raise ValueError(f"{where}: planes {spans} must tile [0, {self.record_bytes}) exactly")
        for p in self.planes:
            bits = CODEC_BITS.get(p.codec)
            if bits is None or p.elements * bits != 8 * p.nbytes:
                raise ValueError(f"{where}: plane {p.name} holds {p.elements} x {p.codec} in {p.nbytes} bytes")
        nope, scale, rope = self.planes
        if scale.elements * self.scale_block != nope.elements:
            raise ValueError(f"{where}: {scale.elements} scales x {self.scale_block} != {nope.elements} NoPE values")
        if sorted(self.scale_slots) != list(range(scale.elements)):
            raise ValueError(f"{where}: scale_slots must permute range({scale.elements})")
        if nope.elements + rope.elements != self.row_dim:
            raise ValueError(f"{where}: row_dim={self.row_dim} != {nope.elements} + {rope.elements}")
        if self.record_bytes % self.align:
            raise ValueError(f"{where}: record_bytes={self.record_bytes} is not a multiple of align={self.align}")

    def plane(self, name: str) -> Plane:
        for p in self.planes:
            if p.name == name:
                return p
        raise KeyError(f"plane {name!r}: format {self.name} has {', '.join(PLANE_NAMES)}")

    @property
    def nope_dim(self) -> int:
        return self.plane("nope").elements

    @property
    def rope_dim(self) -> int:
        return self.plane("rope").elements

    @property
    def scales(self) -> int:
        return self.plane("scale").elements

    def scale_byte(self, block: int) -> int:
        """The record byte where the scale of NoPE element block ``block`` starts."""
        scale = self.plane("scale")
        return scale.offset + self.scale_slots[block] * CODEC_BITS[scale.codec] // 8


def _nvfp4_scale_slots() -> tuple[int, ...]:
    # Block s's scale at slot 8 * (s & 3) + (s >> 2): the 8x4 -> 4x8 transpose that lets each
    # of a warp's four quarter-threads read its eight scales as one contiguous 8-byte word.
    return tuple(8 * (s & 3) + (s >> 2) for s in range(32))


FP8_DS_MLA = Format(
    name="fp8_ds_mla",
    record_bytes=656,
    planes=(
        Plane(name="nope", offset=0, nbytes=512, elements=512, codec="e4m3fn"),
        Plane(name="scale", offset=512, nbytes=16, elements=4, codec="f32_le"),
        Plane(name="rope", offset=528, nbytes=128, elements=64, codec="bf16_bits"),
    ),
    scale_block=128,
    scale_slots=(0, 1, 2, 3),
    row_dim=576,
    align=16,  # 656 = 41 x 16
    source="docs/contract.md, The paged cache; vLLM csrc/libtorch_stable/cache_kernels.cu (concat_and_cache_ds_mla)",
)

NVFP4_DS_MLA = Format(
    name="nvfp4_ds_mla",
    record_bytes=352,
    planes=(
        Plane(name="nope", offset=0, nbytes=256, elements=512, codec="e2m1x2"),
        Plane(name="scale", offset=320, nbytes=32, elements=32, codec="e4m3fn"),  # after the RoPE bytes
        Plane(name="rope", offset=256, nbytes=64, elements=64, codec="e4m3fn"),  # unscaled
    ),
    scale_block=16,
    scale_slots=_nvfp4_scale_slots(),
    row_dim=576,
    align=16,  # 352 = 22 x 16
    source="docs/contract.md, Cache formats; vLLM csrc/libtorch_stable/nvfp4_ds_mla_cache_kernels.cu @03b6016490",
)

#: Every format by name, in the order they came.
FORMATS: Mapping[str, Format] = MappingProxyType({f.name: f for f in (FP8_DS_MLA, NVFP4_DS_MLA)})


def get(name: object) -> Format:
    """The row of format ``name``; ValueError naming the formats for an unknown one."""
    try:
        return FORMATS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(f"format={name!r}: expected one of {', '.join(FORMATS)}") from None


def names() -> tuple[str, ...]:
    return tuple(FORMATS)


def by_record_bytes(nbytes: int) -> Format:
    """The format whose records are ``nbytes`` long (how FlashMLA tells them apart)."""
    for f in FORMATS.values():
        if f.record_bytes == nbytes:
            return f
    sizes = ", ".join(f"{f.record_bytes} ({f.name})" for f in FORMATS.values())
    raise ValueError(f"record_bytes={nbytes}: no cache format has it (formats: {sizes})")
