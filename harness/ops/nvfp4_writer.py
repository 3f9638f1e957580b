"""The ``nvfp4_writer`` op's row of the op table (SPEC.md section 11.3): vLLM's
``concat_and_cache_mla(..., kv_cache_dtype="nvfp4_ds_mla")``, its cache compared byte for byte
with the oracle's under the nvfp4 writer revision (``oracles.formats.writer_rules``): vLLM's CUDA
writer's, ``rn_bump.mul_recip``, the default; a case may name another in ``params["nvfp4_revision"]``."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import nvfp4_writer as gen
from mlafuzz.generators.spec import Paging
from mlafuzz.harness.ops.op import Bench, CallShape, Op, Outputs, Workload
from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.table import get

_FORMAT = get("nvfp4_ds_mla")


def revision_of(case: Case) -> str:
    return case.params.get("nvfp4_revision") or writer_rules.DEFAULT


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    kv_cache_dtype = case.params.get("kv_cache_dtype", gen.KV_CACHE_DTYPE)
    fn(t["kv_c"], t["k_pe"], t["kv_cache"], t["slot_mapping"], kv_cache_dtype, t["scale"])
    return {"kv_cache": t["kv_cache"]}


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles.formats import nvfp4_write

        fn = nvfp4_write.write_records_loop if loop else nvfp4_write.write_records
        t = case.tensors
        cache, slots = t["kv_cache"], t["slot_mapping"]
        zero = case.zero_blocks.get("kv_cache", 0)
        if zero:  # the blocks past the zero ones, and the slots in them (a valid case has no other)
            shift = zero * cache.shape[1]
            cache, slots = cache[zero:], torch.where(slots >= 0, slots - shift, slots)
        out = fn(kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache=cache, slot_mapping=slots, revision=revision_of(case))
        return {"kv_cache": out}

    return run


def _workload(impls: dict[str, Callable], *, tokens: int = 65536, bs: int = 64) -> Workload:
    """bench: 65536 tokens written to a cache of as many slots, in a random order."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    kv_c = torch.randn((tokens, 512), device=dev, generator=g).to(torch.bfloat16)
    k_pe = torch.randn((tokens, 64), device=dev, generator=g).to(torch.bfloat16)
    cache = torch.zeros((tokens // bs, bs, _FORMAT.record_bytes), dtype=torch.uint8, device=dev)
    slots = torch.randperm(tokens, device=dev, generator=g)
    scale = torch.ones(1, device=dev)
    nbytes = kv_c.numel() * 2 + k_pe.numel() * 2 + slots.numel() * 8 + tokens * _FORMAT.record_bytes
    run = {name: (lambda fn=fn: fn(kv_c, k_pe, cache, slots, gen.KV_CACHE_DTYPE, scale)) for name, fn in impls.items()}
    return Workload(name=f"nvfp4_writer {tokens} tokens", nbytes=nbytes, run=run)


def _realistic() -> gen.Nvfp4WriterSpec:
    """65536 tokens, block size 64, kv_c and k_pe split from one [T, 576] tensor as vLLM passes them."""
    return gen.Nvfp4WriterSpec(num_tokens=65536, paging=Paging(block_size=64, layout="shuffled"), inputs_view="columns")


NVFP4_WRITER = Op(
    name="nvfp4_writer",
    share=5,  # like writer's for now (its cases/s on the H200 not measured yet)
    generator=gen.GENERATOR,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    defaults={"cpu": ("torch",), "cuda": ("torch",)},
    contract=frozenset({"wrong_dtype", "wrong_shape"}),  # as the fp8 writer's
    inplace=frozenset({"kv_cache"}),
    call=CallShape(positional=("kv_c", "k_pe", "kv_cache", "slot_mapping", "kv_cache_dtype", "scale")),
    ours="torch",
    vllm=(("vllm._custom_ops", "concat_and_cache_mla"),),
    bench=Bench(workload=_workload, realistic=_realistic),
)
