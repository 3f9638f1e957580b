"""The writer op's spec (SPEC section 2, "Writer"): activations quantized into cache records.

Registered into the shared registries (spec types, materializers, drawers,
features) on import; generators/__init__ imports it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

import torch

from mlafuzz.generators import catalog
from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import SPEC_DRAWERS, Drawer, Knobs, draw_paging
from mlafuzz.generators.features import FEATURE_FNS
from mlafuzz.generators.materialize import build_block_table, make_cache, materializer
from mlafuzz.generators.spec import Paging, ValueMode, _check_int, _coerce_enum, register_spec


class InputDtype(str, enum.Enum):
    BF16 = "bfloat16"
    FP16 = "float16"


class WriterValues(str, enum.Enum):
    NORMAL = "normal"  # N(0, 1) activations
    WIDE = "wide"  # per-tile magnitudes from 2^-30 to 2^30
    EXTREME = "extreme"  # zeros, subnormals, +-max, ties at tile amax, saturating ratios
    NAN = "nan"  # NaN and inf elements mixed in


@register_spec
@dataclass(frozen=True, kw_only=True)
class WriterSpec:
    op: ClassVar[str] = "writer"
    num_tokens: int
    paging: Paging = Paging()
    input_dtype: InputDtype = InputDtype.BF16
    values: WriterValues = WriterValues.NORMAL
    padding: bool = False  # some tokens get slot -1 and must write nothing

    def __post_init__(self) -> None:
        _check_int("WriterSpec", "num_tokens", self.num_tokens, lo=0, hi=1 << 20)
        _coerce_enum(self, "input_dtype", InputDtype)
        _coerce_enum(self, "values", WriterValues)


def _inputs(spec: WriterSpec, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    t = spec.num_tokens
    kv = torch.randn((t, 4, 128), generator=gen)
    if spec.values is WriterValues.WIDE:
        kv = kv * torch.exp2(torch.randint(-30, 31, (t, 4, 1), generator=gen).float())
    elif spec.values is WriterValues.EXTREME:
        specials = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 3.0e38, -3.0e38, 448.0, 1e-45, 65504.0, 2.0 ** -126])
        pick = torch.randint(0, len(specials), (t, 4, 128), generator=gen)
        hit = torch.randint(0, 3, (t, 4, 128), generator=gen) == 0
        kv = torch.where(hit, specials[pick], kv)
        zero_tile = torch.randint(0, 6, (t, 4, 1), generator=gen) == 0
        kv = kv.masked_fill(zero_tile, 0.0)
    elif spec.values is WriterValues.NAN:
        nonfinite = torch.tensor([float("nan"), float("inf"), float("-inf")])
        hit = torch.randint(0, 40, (t, 4, 128), generator=gen) == 0
        kv = torch.where(hit, nonfinite[torch.randint(0, 3, (t, 4, 128), generator=gen)], kv)
    dtype = getattr(torch, spec.input_dtype.value)
    k_pe = torch.randn((t, 64), generator=gen)
    if spec.values in (WriterValues.EXTREME, WriterValues.NAN):
        bits = torch.tensor(catalog.ROPE_SPECIAL_BITS, dtype=torch.int32).to(torch.int16)
        hit = torch.randint(0, 8, (t, 64), generator=gen) == 0
        k_pe = torch.where(hit, bits[torch.randint(0, len(bits), (t, 64), generator=gen)].view(torch.bfloat16).float(),
                           k_pe)
    return kv.reshape(t, 512).to(dtype), k_pe.to(dtype)


@materializer(WriterSpec)
def materialize_writer(spec: WriterSpec, gen: torch.Generator) -> Case:
    bs = spec.paging.block_size
    _table, pool = build_block_table(paging=spec.paging, seq_lens=[spec.num_tokens], gen=gen)
    # The cache starts full of other records: a writer that touches a slot it
    # should not is caught by the byte-for-byte comparison of the whole cache.
    cache = make_cache(mode=ValueMode.ALL_CODES, num_blocks=pool, block_size=bs, gen=gen)
    slots = torch.randperm(pool * bs, generator=gen)[:spec.num_tokens]
    if spec.padding and spec.num_tokens:
        pad = torch.randint(0, 4, (spec.num_tokens,), generator=gen) == 0
        slots = torch.where(pad, torch.full_like(slots, -1), slots)
    kv_c, k_pe = _inputs(spec, gen)
    tensors = {"kv_c": kv_c, "k_pe": k_pe, "kv_cache": cache, "slot_mapping": slots.to(torch.int64),
               "scale": torch.ones(1, dtype=torch.float32)}
    return Case(op="writer", spec=spec, seed=0, device="cpu", tensors=tensors, params={})


def draw_writer_spec(d: Drawer, knobs: Knobs) -> WriterSpec:
    return WriterSpec(num_tokens=d.integer(0, knobs.max_requests * knobs.max_tokens_per_request * 4),
                      paging=draw_paging(d, knobs), input_dtype=d.choice(list(InputDtype)),
                      values=d.choice(list(WriterValues)), padding=d.boolean())


SPEC_DRAWERS["writer"] = draw_writer_spec
FEATURE_FNS[WriterSpec] = lambda s: {f"writer:{s.values.value}", f"dtype:{s.input_dtype.value}"} | (
    {"padding"} if s.padding else set())
