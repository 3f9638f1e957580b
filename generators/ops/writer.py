"""The ``writer`` op's inputs (SPEC.md section 2, "Writer"): activations quantized into cache
records. Spec, drawer, materializer, features, shrink steps and error-input classes; the op table
(harness/ops) wires them to the oracle and the call.

Two later surfaces, drawn in some cases:
- ``skip_scale`` (vLLM 0.33.0's keyword of ``concat_and_cache_mla``): an optional capability read
  from the signature (``needs``, ``fit``); passed True only with the global scale at 1.0, as vLLM's
  call sites pass it (``skip_scale = k_scale == 1.0``), and False at times too.
- a packed multi-layer cache (SPEC 8's call-site views; vLLM lays every layer of a group out in one
  tensor, layer i at ``i * layer_stride`` bytes): ``kv_cache`` is layer ``layer`` (>= 1: a
  non-zero storage offset) of a ``[layers, blocks, bs, 656]`` tensor whose other layers hold other
  records, so a writer that ignores the view's offset writes layer 0 (vLLM #57019). The op row
  checks the other layers unchanged (harness/ops/writer.py ``other_layers``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import torch

from mlafuzz.generators.case import Case, paged_case
from mlafuzz.generators.draw import Drawer, Knobs, draw_paging, one_in, sized
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.invalid import InvalidClass, with_
from mlafuzz.generators.reduce import halvings, paging_steps, view_features, view_steps
from mlafuzz.generators.rng.fill import WRITER_MODES, distinct_slots, writer_inputs
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.rng.records import paged_cache
from mlafuzz.generators.spec import (
    InputDtype,
    Paging,
    ValueMode,
    View,
    check_int,
    coerce_enum,
    fail,
)
from mlafuzz.oracles.formats import table as formats

# At most 4 layers: a case's copy (generators/case.py clone_like) keeps a view's base, and with it
# the other layers, only while the base is at most about four times the view.
MAX_LAYERS = 4
SKIP_SCALE = "skip_scale"  # the capability (kernels/external.py)


class WriterValues(str, enum.Enum):
    """How the writer's input values are drawn (their pools: generators/rng/fill.py ``writer_inputs``)."""

    NORMAL = "normal"  # N(0, 1) activations
    WIDE = "wide"  # per-tile magnitudes from 2^-30 to 2^30
    EXTREME = "extreme"  # zeros, subnormals, +-max, ties at tile amax, saturating ratios
    NAN = "nan"  # NaN and inf elements mixed in


if tuple(v.value for v in WriterValues) != WRITER_MODES:  # the pools know exactly these modes
    raise ImportError(f"WriterValues {[v.value for v in WriterValues]} != generators/rng/fill.py's {WRITER_MODES}")


@dataclass(frozen=True, kw_only=True)
class WriterSpec:
    op: ClassVar[str] = "writer"
    num_tokens: int
    paging: Paging = Paging()
    input_dtype: InputDtype = InputDtype.BF16
    values: WriterValues = WriterValues.NORMAL
    padding: bool = False  # some tokens get slot -1 and must write nothing
    # COLUMNS: kv_c and k_pe are the two parts of one [T, 576] tensor, as vLLM passes them (SPEC 8);
    # PLAIN: two contiguous tensors.
    inputs_view: View = View.PLAIN
    skip_scale: bool | None = None  # vLLM 0.33.0's keyword (None: not passed)
    layers: int = 1  # > 1: kv_cache is one layer's view of a packed [layers, blocks, bs, 656] cache
    layer: int = 0  # which layer's view

    def __post_init__(self) -> None:
        check_int("WriterSpec", "num_tokens", self.num_tokens, lo=0, hi=1 << 20)
        check_int("WriterSpec", "layers", self.layers, lo=1, hi=MAX_LAYERS)
        check_int("WriterSpec", "layer", self.layer, lo=0, hi=self.layers - 1)
        if self.layers > 1 and self.paging.base_block:
            fail("WriterSpec", "layers", self.layers, "a packed cache has no zero blocks (paging.base_block must be 0)")
        coerce_enum(self, "input_dtype", InputDtype)
        coerce_enum(self, "values", WriterValues)
        coerce_enum(self, "inputs_view", View)
        if self.inputs_view is View.ROWS:
            fail("WriterSpec", "inputs_view", self.inputs_view.value, "must be plain or columns")


def materialize(spec: WriterSpec, *, seed: int, device: str) -> Case:
    """The call's tensors on ``device`` (``call_case``): its cache's pool starts full of other
    fp8_ds_mla records (a packed multi-layer cache's other layers too)."""
    bs, base = spec.paging.block_size, spec.paging.base_block

    def cache(draws: Draws, pool: int) -> torch.Tensor:
        made = paged_cache(
            draws.child("cache"), ValueMode.ALL_CODES, pool_blocks=pool, block_size=bs, base_block=base, device=device
        )
        return _packed(made, draws=draws, spec=spec, pool=pool, device=device) if spec.layers > 1 else made

    params = {} if spec.skip_scale is None else {"skip_scale": spec.skip_scale}
    return call_case(spec, seed=seed, device=device, cache=cache, params=params)


def call_case(
    spec: WriterSpec, *, seed: int, device: str, cache: Callable[[Draws, int], torch.Tensor], params: dict[str, Any]
) -> Case:
    """A writer call's case on ``device`` (the fp8 and nvfp4 writers'): ``cache(draws, pool)`` makes
    the cache, its pool (enough blocks for every token, plus spares) full of other records, so a
    writer that touches a slot it should not is caught byte for byte; blocks below
    paging.base_block are zeros no valid slot maps to (``Case.zero_blocks``). Distinct slots in the
    pool (some -1 with padding), kv_c and k_pe the NoPE and RoPE parts of one drawn [T, 576] row
    (contiguous copies unless inputs_view is COLUMNS), the global scale 1.0. Streams are named by
    the op (``Draws(seed, spec.op)``)."""
    draws = Draws(seed, spec.op)
    bs, base, t = spec.paging.block_size, spec.paging.base_block, spec.num_tokens
    pool = -(-t // bs) + spec.paging.spare_blocks
    kv_cache = cache(draws, pool)
    slots = distinct_slots(
        draws.child("slots"), n=t, num_slots=pool * bs, padding=spec.padding, offset=base * bs, device=device
    )
    rows = writer_inputs(
        draws.child("inputs"),
        num_tokens=t,
        values=spec.values,
        dtype=getattr(torch, spec.input_dtype.value),
        device=device,
    )
    nope = formats.get("fp8_ds_mla").nope_dim  # kv_c is the row's NoPE part, k_pe its RoPE
    kv_c, k_pe = rows[:, :nope], rows[:, nope:]
    if spec.inputs_view is View.PLAIN:
        kv_c, k_pe = kv_c.contiguous(), k_pe.contiguous()
    tensors = {
        "kv_c": kv_c,
        "k_pe": k_pe,
        "kv_cache": kv_cache,
        "slot_mapping": slots,
        "scale": torch.ones(1, dtype=torch.float32, device=device),
    }
    return paged_case(spec, seed=seed, device=device, tensors=tensors, params=params, cache="kv_cache")


def _packed(cache: torch.Tensor, *, draws: Draws, spec: WriterSpec, pool: int, device: str) -> torch.Tensor:
    """``cache`` as layer ``spec.layer`` of a packed cache whose other layers hold records of their
    own (a write into them changes bytes); the view of that layer (its storage offset non-zero)."""
    packed = torch.empty((spec.layers, *cache.shape), dtype=cache.dtype, device=device)
    for i in range(spec.layers):
        if i == spec.layer:
            packed[i] = cache
        else:
            packed[i] = paged_cache(
                draws.child(f"layer{i}"), ValueMode.ALL_CODES, pool_blocks=pool, block_size=spec.paging.block_size,
                device=device,
            )  # fmt: skip
    return packed[spec.layer]


def draw(d: Drawer, knobs: Knobs) -> WriterSpec:
    """Tokens up to max_rows (a decode step's few, a prefill chunk's thousands; at the writer's tiles
    a quarter of the time), their blocks at most max_records records."""
    paging = draw_paging(d, knobs)
    hi = max(0, min(knobs.max_rows, knobs.max_records - paging.spare_blocks * paging.block_size))
    tokens = (
        sized(d, knobs, 0, hi, tiles=knobs.row_tiles)
        if knobs.log_sizes
        else d.integer(0, min(hi, knobs.max_requests * knobs.max_tokens_per_request * 4))
    )
    spec = WriterSpec(
        num_tokens=tokens,
        paging=paging,
        input_dtype=d.choice(list(InputDtype)),
        values=d.choice(list(WriterValues)),
        padding=d.boolean(),
        inputs_view=View.PLAIN if one_in(d, knobs.views_one_in) else View.COLUMNS,
        skip_scale=d.choice((None, False, True)),
    )
    # A packed multi-layer cache in a third of the cases whose layers all fit the records budget.
    records = (-(-tokens // paging.block_size) + paging.spare_blocks) * paging.block_size
    if one_in(d, 3) and not paging.base_block:
        layers = d.integer(2, MAX_LAYERS)
        if layers * records <= knobs.max_records:
            spec = dataclasses.replace(spec, layers=layers, layer=d.integer(1, layers - 1))
    return spec


def features(s: WriterSpec) -> set[str]:
    return (
        {f"writer:{s.values.value}", f"dtype:{s.input_dtype.value}"}
        | ({"padding"} if s.padding else set())
        | view_features(s.paging, inputs=s.inputs_view)
        | ({f"skip_scale:{'on' if s.skip_scale else 'off'}"} if s.skip_scale is not None else set())
        | ({"cache:packed-layers"} if s.layers > 1 else set())
    )


def size(spec: WriterSpec) -> dict[str, int]:
    return {"tokens": spec.num_tokens}


def reduce(s: WriterSpec) -> Iterator[WriterSpec]:
    for v in halvings(s.num_tokens):
        yield dataclasses.replace(s, num_tokens=v)
    if s.padding:
        yield dataclasses.replace(s, padding=False)
    for p in paging_steps(s.paging):
        yield dataclasses.replace(s, paging=p)
    yield from view_steps(s, "inputs_view")
    if s.values is not WriterValues.NORMAL:
        yield dataclasses.replace(s, values=WriterValues.NORMAL)
    if s.layers > 1:
        yield dataclasses.replace(s, layers=1, layer=0)
    if s.skip_scale is not None:
        yield dataclasses.replace(s, skip_scale=None)


def needs(case: Case) -> frozenset[str]:
    return frozenset({SKIP_SCALE} if "skip_scale" in case.params else ())


def fit(spec: WriterSpec, capabilities: frozenset[str]) -> WriterSpec:
    return (
        dataclasses.replace(spec, skip_scale=None)
        if spec.skip_scale is not None and SKIP_SCALE not in capabilities
        else spec
    )


# --- error inputs (SPEC section 2 and vLLM's host-side checks of concat_and_cache_mla) ---


def _writer_wrong_dtype(case: Case) -> Case | None:
    return with_(case, tensors={"kv_c": case.tensors["kv_c"].float()})


def _writer_wrong_shape(case: Case) -> Case | None:
    kv_c = case.tensors["kv_c"]
    return with_(case, tensors={"kv_c": kv_c[:, :511]}) if kv_c.shape[0] else None


def _writer_device_mismatch(case: Case) -> Case | None:
    if not case.device.startswith("cuda"):
        return None
    return with_(case, tensors={"slot_mapping": case.tensors["slot_mapping"].cpu()})


def _unsupported_kv_cache_dtype(case: Case) -> Case | None:
    return with_(case, params={"kv_cache_dtype": "auto"})


def _slot_past_cache(case: Case) -> Case | None:
    slots = case.tensors["slot_mapping"]
    if not slots.numel():
        return None
    cache = case.tensors["kv_cache"]
    bad = slots.clone()
    bad[-1] = cache.shape[0] * cache.shape[1] + 3
    return with_(case, tensors={"slot_mapping": bad})


INVALID: tuple[InvalidClass, ...] = (
    InvalidClass(
        name="wrong_dtype", memory_safe=True, make=_writer_wrong_dtype, description="kv_c is float32, not bf16 or fp16"
    ),
    InvalidClass(
        name="wrong_shape", memory_safe=False, make=_writer_wrong_shape, description="kv_c has 511 columns, not 512"
    ),
    InvalidClass(
        name="device_mismatch",
        memory_safe=False,
        make=_writer_device_mismatch,
        description="slot_mapping on the CPU, the rest on the GPU",
    ),
    InvalidClass(
        name="unsupported_kv_cache_dtype",
        memory_safe=True,
        make=_unsupported_kv_cache_dtype,
        description="kv_cache_dtype is 'auto', not 'fp8_ds_mla'",
    ),
    InvalidClass(
        name="slot_past_cache",
        memory_safe=False,
        make=_slot_past_cache,
        description="a slot >= num_blocks * block_size",
    ),
)


GENERATOR = Generator(
    spec_type=WriterSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=size,
    reduce=reduce,
    invalid=INVALID,
)
