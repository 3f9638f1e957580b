"""The ``writer`` op's inputs (SPEC.md section 2, "Writer"): activations quantized into cache
records. Spec, drawer, materializer, features, shrink steps and error-input classes; the op table
(harness/ops) wires them to the oracle and the call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import torch

from mlafuzz.generators import catalog
from mlafuzz.generators.case import Case, built, local_generator
from mlafuzz.generators.draw import Drawer, Knobs, draw_paging
from mlafuzz.generators.invalid import InvalidClass, with_
from mlafuzz.generators.paging import build_block_table
from mlafuzz.generators.records import make_cache
from mlafuzz.generators.reduce import halvings, paging_steps
from mlafuzz.generators.spec import InputDtype, Paging, ValueMode, WriterValues, check_int, coerce_enum


@dataclass(frozen=True, kw_only=True)
class WriterSpec:
    op: ClassVar[str] = "writer"
    num_tokens: int
    paging: Paging = Paging()
    input_dtype: InputDtype = InputDtype.BF16
    values: WriterValues = WriterValues.NORMAL
    padding: bool = False  # some tokens get slot -1 and must write nothing

    def __post_init__(self) -> None:
        check_int("WriterSpec", "num_tokens", self.num_tokens, lo=0, hi=1 << 20)
        coerce_enum(self, "input_dtype", InputDtype)
        coerce_enum(self, "values", WriterValues)


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


def materialize(spec: WriterSpec, *, seed: int, device: str) -> Case:
    gen = local_generator(seed)
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
    return built(op="writer", spec=spec, seed=seed, device=device, tensors=tensors, params={})


def draw(d: Drawer, knobs: Knobs) -> WriterSpec:
    return WriterSpec(num_tokens=d.integer(0, knobs.max_requests * knobs.max_tokens_per_request * 4),
                      paging=draw_paging(d, knobs), input_dtype=d.choice(list(InputDtype)),
                      values=d.choice(list(WriterValues)), padding=d.boolean())


def features(s: WriterSpec) -> set[str]:
    return {f"writer:{s.values.value}", f"dtype:{s.input_dtype.value}"} | ({"padding"} if s.padding else set())


def size(spec: WriterSpec) -> dict[str, int]:
    return {"tokens": spec.num_tokens}


def reduce(s: WriterSpec) -> Iterator[WriterSpec]:
    for v in halvings(s.num_tokens):
        yield dataclasses.replace(s, num_tokens=v)
    if s.padding:
        yield dataclasses.replace(s, padding=False)
    for p in paging_steps(s.paging):
        yield dataclasses.replace(s, paging=p)
    if s.values is not WriterValues.NORMAL:
        yield dataclasses.replace(s, values=WriterValues.NORMAL)


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
    InvalidClass(name="wrong_dtype", memory_safe=True, make=_writer_wrong_dtype,
                 description="kv_c is float32, not bf16 or fp16"),
    InvalidClass(name="wrong_shape", memory_safe=False, make=_writer_wrong_shape,
                 description="kv_c has 511 columns, not 512"),
    InvalidClass(name="device_mismatch", memory_safe=False, make=_writer_device_mismatch,
                 description="slot_mapping on the CPU, the rest on the GPU"),
    InvalidClass(name="unsupported_kv_cache_dtype", memory_safe=True, make=_unsupported_kv_cache_dtype,
                 description="kv_cache_dtype is 'auto', not 'fp8_ds_mla'"),
    InvalidClass(name="slot_past_cache", memory_safe=False, make=_slot_past_cache,
                 description="a slot >= num_blocks * block_size"),
)
