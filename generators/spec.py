"""Frozen, validated, JSON-round-trippable case specs (SPEC.md section 1).

A spec is small: it says *what shape* a batch has (requests, paging, top-k
mode, value mode), never the tensors themselves. An op's materializer turns
(spec, seed, device) into tensors, so (spec, seed) is a complete, replayable
description of a case. This module holds what every op's spec shares (paging,
the value and layout enums, field checks, the JSON codec); each op's own spec
lives in generators/ops/<op>.py, and the op table (harness/ops) says which
class decodes which ``op`` tag.

Every field is checked at construction and errors read ``name=value``, the way
Hypothesis checks its arguments, so a hand-edited spec file fails with one line
that says which field is wrong.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping

# 2: cases made on the device from counter-based streams (generators/rng), paging.base_block and the
# call-site views (SPEC 8). A version-1 spec names a case the old CPU generator made: its bytes are
# gone, so it is refused rather than replayed as something else.
SCHEMA_VERSION = 2


class SpecError(ValueError):
    """A spec (or spec file) that is ill-formed: unknown field, wrong type, bad value."""


class Layout(str, enum.Enum):
    """How request blocks map onto physical cache blocks."""

    CONTIGUOUS = "contiguous"  # request r owns the next run of block ids
    SHUFFLED = "shuffled"  # block ids drawn from a permuted pool: unsorted, gappy
    SHARED_PREFIX = "shared_prefix"  # leading blocks shared by all requests (prefix caching)


class View(str, enum.Enum):
    """How a tensor sits in memory when the kernel gets it: vLLM's call sites pass views (SPEC 8)."""

    PLAIN = "plain"  # its own contiguous allocation
    COLUMNS = "columns"  # a column slice of a wider tensor (row stride > width; kv_c / k_pe split from [T, 576])
    ROWS = "rows"  # a row slice of a taller tensor (a non-zero storage offset)


class TopkMode(str, enum.Enum):
    """What the indexer's top-k rows contain (SPEC section 1, 'Top-k indices')."""

    VALID = "valid"  # every column a real position < seq_len
    PADDED = "padded"  # real positions, then -1 padding
    NEGATIVE = "negative"  # negatives other than -1 mixed in (INT32_MIN too)
    PAST_TABLE = "past_table"  # positions whose block index is >= the table width
    PAST_SEQ_LEN = "past_seq_len"  # inside the table but past the request's length
    MIXED = "mixed"  # every class above, element by element


class ValueMode(str, enum.Enum):
    """What the fp8_ds_mla cache records hold (SPEC section 2)."""

    ACTIVATIONS = "activations"  # real-looking activations run through the writer
    ALL_CODES = "all_codes"  # raw records covering all 256 fp8 codes
    EXTREME_SCALES = "extreme_scales"  # FLT_MIN, subnormal, huge and zero scales
    SUBNORMAL = "subnormal"  # scales that make most products subnormal
    NAN = "nan"  # NaN codes, NaN/inf scales, NaN rope bit patterns


class WsForm(str, enum.Enum):
    """The two workspace_starts forms callers pass to gather (SPEC section 4)."""

    EXACT = "exact"  # [batch_size]
    CUMULATIVE = "cumulative"  # [batch_size + 1], last entry ignored


class InputDtype(str, enum.Enum):
    BF16 = "bfloat16"
    FP16 = "float16"


def fail(owner: str, name: str, value: Any, why: str) -> None:
    raise SpecError(f"{owner}: {name}={value!r} {why}")


def coerce_enum(obj: Any, name: str, enum_cls: type[enum.Enum]) -> None:
    """Accept the enum or its string value (so hand-written specs read naturally)."""
    value = getattr(obj, name)
    try:
        object.__setattr__(obj, name, enum_cls(value))
    except ValueError:
        allowed = ", ".join(m.value for m in enum_cls)
        fail(type(obj).__name__, name, value, f"must be one of: {allowed}")


def coerce_tuple(obj: Any, name: str, item_cls: type) -> None:
    value = getattr(obj, name)
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, item_cls) for v in value):
        fail(type(obj).__name__, name, value, f"must be a tuple of {item_cls.__name__}")
    object.__setattr__(obj, name, tuple(value))


def check_int(owner: str, name: str, value: Any, *, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(owner, name, value, "must be an int")
    if value < lo or (hi is not None and value > hi):
        fail(owner, name, value, f"must be in [{lo}, {hi if hi is not None else 'inf'}]")


def check_topk_tiling(owner: str, *, topk: int, block_n: int) -> None:
    """K and BLOCK_N as the convert kernel needs them: a power-of-two tile that divides K."""
    check_int(owner, "block_n", block_n, lo=1, hi=4096)
    if block_n & (block_n - 1):
        fail(owner, "block_n", block_n, "must be a power of two")
    check_int(owner, "topk", topk, lo=1, hi=1 << 16)
    if topk % block_n:
        fail(owner, "topk", topk, f"must be a multiple of block_n={block_n}")


@dataclass(frozen=True, kw_only=True)
class Paging:
    """The paged cache shared by every op: block size and block-id layout."""

    block_size: int = 64
    layout: Layout = Layout.CONTIGUOUS
    spare_blocks: int = 0  # physical blocks no request owns (ids beyond need)
    extra_table_cols: int = 0  # block-table columns past the longest request
    # The case's blocks are ids base_block, base_block + 1, ...: the cache holds base_block blocks of
    # zeros below them (allocated, never generated, never read or written by a valid call), so record
    # byte offsets pass 2**31 and 2**32 as in a cache that fills the GPU (SPEC 8).
    base_block: int = 0

    def __post_init__(self) -> None:
        coerce_enum(self, "layout", Layout)
        check_int("Paging", "block_size", self.block_size, lo=1, hi=4096)
        check_int("Paging", "spare_blocks", self.spare_blocks, lo=0, hi=1 << 16)
        check_int("Paging", "extra_table_cols", self.extra_table_cols, lo=0, hi=1 << 16)
        check_int("Paging", "base_block", self.base_block, lo=0, hi=(1 << 31) - (1 << 20))


# --- JSON round trip -------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def spec_to_dict(spec: Any) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "op": spec.op, "spec": _encode(spec)}


def _decode(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # an optional field, ``T | None``
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(inner) < len(typing.get_args(tp)):
            return None
        if len(inner) != 1:
            raise SpecError(f"{where}: unsupported field type {tp!r}")  # a bug in a spec class
        return _decode(inner[0], value, where)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SpecError(f"{where}={value!r} must be a list")
        return tuple(_decode(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(m.value for m in tp)
            raise SpecError(f"{where}={value!r} must be one of: {allowed}") from None
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{where}={value!r} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{where}={value!r} must be an integer")
        return value
    raise SpecError(f"{where}: unsupported field type {tp!r}")  # a bug in a spec class


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # Resolving a class's annotations is hundreds of Python calls; a realistic spec holds hundreds
    # of requests of one class.
    return typing.get_type_hints(cls)


def _decode_dataclass(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}={value!r} must be an object")
    hints = _hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - known)
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r} for {cls.__name__} (known: {', '.join(sorted(known))})")
    kwargs = {k: _decode(hints[k], v, f"{where}.{k}") for k, v in value.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise SpecError(f"{where}: {exc}") from None


def spec_from_dict(data: Any, *, types: Mapping[str, type]) -> Any:
    """Inverse of spec_to_dict; ``types`` maps each op tag to its spec class (the op table's
    ``spec_types``). Every failure is a one-line SpecError."""
    if not isinstance(data, Mapping):
        raise SpecError(f"spec file must hold a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"schema_version", "op", "spec"})
    if unknown:
        raise SpecError(f"unknown top-level field {unknown[0]!r} (known: op, schema_version, spec)")
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and 0 < version < SCHEMA_VERSION:
        raise SpecError(
            f"schema_version={version} was written by an older mlafuzz whose generator made other"
            f" bytes for the same spec and seed: it cannot be replayed bit-identically (this mlafuzz"
            f" reads {SCHEMA_VERSION}); draw the case again"
        )
    if version != SCHEMA_VERSION:
        raise SpecError(f"schema_version={version!r} is not supported (this mlafuzz reads {SCHEMA_VERSION})")
    op = data.get("op")
    if op not in types:
        raise SpecError(f"op={op!r} must be one of: {', '.join(sorted(types))}")
    return _decode_dataclass(types[op], data.get("spec"), "spec")


def spec_to_json(spec: Any) -> str:
    return json.dumps(spec_to_dict(spec), sort_keys=True)


def spec_from_json(text: str, *, types: Mapping[str, type]) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"spec is not valid JSON: {exc}") from None
    return spec_from_dict(data, types=types)
