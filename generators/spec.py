"""Frozen, validated, JSON-round-trippable case specs (SPEC.md section 1).

A spec is small: it says *what shape* a batch has (requests, paging, top-k
mode, value mode), never the tensors themselves. ``materialize(spec, seed,
device)`` turns it into tensors with a local generator, so (spec, seed) is a
complete, replayable description of a case.

Every field is checked at construction and errors read ``name=value``, the way
Hypothesis checks its arguments, so a hand-edited spec file fails with one line
that says which field is wrong.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

SCHEMA_VERSION = 1


class SpecError(ValueError):
    """A spec (or spec file) that is ill-formed: unknown field, wrong type, bad value."""


class Layout(str, enum.Enum):
    """How request blocks map onto physical cache blocks."""

    CONTIGUOUS = "contiguous"  # request r owns the next run of block ids
    SHUFFLED = "shuffled"  # block ids drawn from a permuted pool: unsorted, gappy
    SHARED_PREFIX = "shared_prefix"  # leading blocks shared by all requests (prefix caching)


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


def _fail(owner: str, name: str, value: Any, why: str) -> None:
    raise SpecError(f"{owner}: {name}={value!r} {why}")


def _coerce_enum(obj: Any, name: str, enum_cls: type[enum.Enum]) -> None:
    """Accept the enum or its string value (so hand-written specs read naturally)."""
    value = getattr(obj, name)
    try:
        object.__setattr__(obj, name, enum_cls(value))
    except ValueError:
        allowed = ", ".join(m.value for m in enum_cls)
        _fail(type(obj).__name__, name, value, f"must be one of: {allowed}")


def _coerce_tuple(obj: Any, name: str, item_cls: type) -> None:
    value = getattr(obj, name)
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, item_cls) for v in value):
        _fail(type(obj).__name__, name, value, f"must be a tuple of {item_cls.__name__}")
    object.__setattr__(obj, name, tuple(value))


def _check_int(owner: str, name: str, value: Any, *, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(owner, name, value, "must be an int")
    if value < lo or (hi is not None and value > hi):
        _fail(owner, name, value, f"must be in [{lo}, {hi if hi is not None else 'inf'}]")


def check_topk_tiling(owner: str, *, topk: int, block_n: int) -> None:
    """K and BLOCK_N as the convert kernel needs them: a power-of-two tile that divides K."""
    _check_int(owner, "block_n", block_n, lo=1, hi=4096)
    if block_n & (block_n - 1):
        _fail(owner, "block_n", block_n, "must be a power of two")
    _check_int(owner, "topk", topk, lo=1, hi=1 << 16)
    if topk % block_n:
        _fail(owner, "topk", topk, f"must be a multiple of block_n={block_n}")


@dataclass(frozen=True, kw_only=True)
class Paging:
    """The paged cache shared by every op: block size and block-id layout."""

    block_size: int = 64
    layout: Layout = Layout.CONTIGUOUS
    spare_blocks: int = 0  # physical blocks no request owns (ids beyond need)
    extra_table_cols: int = 0  # block-table columns past the longest request

    def __post_init__(self) -> None:
        _coerce_enum(self, "layout", Layout)
        _check_int("Paging", "block_size", self.block_size, lo=1, hi=4096)
        _check_int("Paging", "spare_blocks", self.spare_blocks, lo=0, hi=1 << 16)
        _check_int("Paging", "extra_table_cols", self.extra_table_cols, lo=0, hi=1 << 16)


@dataclass(frozen=True, kw_only=True)
class ConvertRequest:
    """A request as the convert kernel sees it: its length and its query rows."""

    seq_len: int  # tokens the request holds (context + this step's query)
    num_tokens: int  # query rows of this request in token_indices
    prefill: bool = False  # rows use the prefill workspace (HAS_PREFILL_WORKSPACE)

    def __post_init__(self) -> None:
        _check_int("ConvertRequest", "seq_len", self.seq_len, lo=0, hi=1 << 24)
        _check_int("ConvertRequest", "num_tokens", self.num_tokens, lo=0, hi=1 << 20)


@dataclass(frozen=True, kw_only=True)
class ConvertSpec:
    """A convert call (SPEC section 3)."""

    op: ClassVar[str] = "convert"
    requests: tuple[ConvertRequest, ...]
    paging: Paging = Paging()
    topk: int = 128  # NUM_TOPK_TOKENS (K)
    block_n: int = 128  # BLOCK_N; K must be a multiple of it
    topk_mode: TopkMode = TopkMode.PADDED
    prefill_workspace: bool = False
    return_valid_counts: bool = True

    def __post_init__(self) -> None:
        _coerce_tuple(self, "requests", ConvertRequest)
        _coerce_enum(self, "topk_mode", TopkMode)
        if not self.requests:
            _fail("ConvertSpec", "requests", self.requests, "must hold at least one request")
        check_topk_tiling("ConvertSpec", topk=self.topk, block_n=self.block_n)
        if self.prefill_workspace is False and any(r.prefill for r in self.requests):
            _fail("ConvertSpec", "prefill_workspace", False, "but a request has prefill=True")


@dataclass(frozen=True, kw_only=True)
class GatherRequest:
    """A gather request: the context it holds and the slice [seq_start, seq_start+length) read."""

    context_len: int
    seq_start: int = 0
    length: int = 0

    def __post_init__(self) -> None:
        _check_int("GatherRequest", "context_len", self.context_len, lo=0, hi=1 << 24)
        _check_int("GatherRequest", "seq_start", self.seq_start, lo=0, hi=1 << 24)
        _check_int("GatherRequest", "length", self.length, lo=0, hi=1 << 24)
        if self.seq_start + self.length > self.context_len:
            _fail("GatherRequest", "length", self.length,
                  f"reads past context_len={self.context_len} from seq_start={self.seq_start}")


@dataclass(frozen=True, kw_only=True)
class GatherSpec:
    """A gather call (SPEC section 4)."""

    op: ClassVar[str] = "gather"
    requests: tuple[GatherRequest, ...]
    paging: Paging = Paging()
    values: ValueMode = ValueMode.ACTIVATIONS
    ws_form: WsForm = WsForm.EXACT
    pass_seq_starts: bool = True  # False: seq_starts=None (requires every seq_start == 0)

    def __post_init__(self) -> None:
        _coerce_tuple(self, "requests", GatherRequest)
        _coerce_enum(self, "values", ValueMode)
        _coerce_enum(self, "ws_form", WsForm)
        if not self.requests:
            _fail("GatherSpec", "requests", self.requests, "must hold at least one request")
        if not self.pass_seq_starts and any(r.seq_start for r in self.requests):
            _fail("GatherSpec", "pass_seq_starts", False, "but a request has seq_start != 0")


# --- JSON round trip -------------------------------------------------------

SPEC_TYPES: dict[str, type] = {}


def register_spec(cls: type) -> type:
    """Make a top-level spec class loadable by its ``op`` tag (registry, not if/elif)."""
    SPEC_TYPES[cls.op] = cls
    return cls


register_spec(ConvertSpec)
register_spec(GatherSpec)


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


def _decode_dataclass(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}={value!r} must be an object")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - known)
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r} for {cls.__name__}"
                        f" (known: {', '.join(sorted(known))})")
    kwargs = {k: _decode(hints[k], v, f"{where}.{k}") for k, v in value.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise SpecError(f"{where}: {exc}") from None


def spec_from_dict(data: Any) -> Any:
    """Inverse of spec_to_dict; every failure is a one-line SpecError."""
    if not isinstance(data, Mapping):
        raise SpecError(f"spec file must hold a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"schema_version", "op", "spec"})
    if unknown:
        raise SpecError(f"unknown top-level field {unknown[0]!r} (known: op, schema_version, spec)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SpecError(f"schema_version={version!r} is not supported (this mlafuzz reads {SCHEMA_VERSION})")
    op = data.get("op")
    if op not in SPEC_TYPES:
        raise SpecError(f"op={op!r} must be one of: {', '.join(sorted(SPEC_TYPES))}")
    return _decode_dataclass(SPEC_TYPES[op], data.get("spec"), "spec")


def spec_to_json(spec: Any) -> str:
    return json.dumps(spec_to_dict(spec), sort_keys=True)


def spec_from_json(text: str) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"spec is not valid JSON: {exc}") from None
    return spec_from_dict(data)
