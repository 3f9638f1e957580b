"""The ``nvfp4_gather`` op's row of the op table (SPEC.md sections 4 and 11.2): vLLM 0.34.0's
``cp_gather_and_upconvert_nvfp4_kv_cache``, judged bit for bit against the exact reader, its
``dst`` guarded as the fp8 gather's is. A case of the unwritten scale class (scale bytes 0x00,
NaN, negative) is judged on NaN-ness and sign alone where those bytes are read (``loose``)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import nvfp4_gather as gen
from mlafuzz.generators.spec import Paging
from mlafuzz.harness.ops.gather import guarded
from mlafuzz.harness.ops.op import Bench, CallShape, Op, Outputs, Workload
from mlafuzz.oracles.formats.table import get

_FORMAT = get("nvfp4_ds_mla")


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    dst = t["dst"]
    fn(t["src_cache"], dst, t["block_table"], t["workspace_starts"], case.params["batch_size"], t["seq_starts"])
    return {"dst": dst}


def _args(case: Case) -> dict[str, Any]:
    t = case.tensors
    return {
        "src_cache": t["src_cache"],
        "block_table": t["block_table"],
        "workspace_starts": t["workspace_starts"],
        "batch_size": case.params["batch_size"],
        "seq_starts": t["seq_starts"],
        "total": case.params["total"],
    }


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles.formats import nvfp4_gather as og

        return {"dst": (og.gather_loop if loop else og.gather)(**_args(case))}

    return run


def loose(case: Case) -> Mapping[str, Any]:
    """The unwritten class's elements read through a scale byte no writer makes."""
    if case.spec.values is not gen.Nvfp4Values.UNWRITTEN:
        return {}
    from mlafuzz.oracles.formats import nvfp4_gather as og

    return {"dst": og.gather_loose(**_args(case))}


def _workload(
    impls: dict[str, Callable], *, requests: int = 64, context: int = 4096, bs: int = 64, device: str = "cuda"
) -> Workload:
    """bench: the upconvert gather of 64 requests of 4096 tokens each from a shuffled paged cache,
    as the fp8_ds_mla gather's row (its bytes: every record read, every bf16 row written, the
    table read). ``device`` and the sizes: a small CPU check of the row."""
    dev = device
    g = torch.Generator(device=dev).manual_seed(0)
    blocks_per_req = context // bs
    num_blocks = requests * blocks_per_req
    nbytes_rec = _FORMAT.record_bytes
    cache = torch.randint(0, 256, (num_blocks, bs, nbytes_rec), dtype=torch.uint8, device=dev, generator=g)
    scale = _FORMAT.plane("scale")
    cache[..., scale.offset : scale.stop] = 0x38  # scale 1.0: the written class's common path
    table = torch.randperm(num_blocks, device=dev, generator=g).to(torch.int32).reshape(requests, blocks_per_req)
    ws = torch.arange(requests, device=dev, dtype=torch.int32) * context
    starts = torch.zeros(requests, dtype=torch.int32, device=dev)
    total = requests * context
    dst = torch.empty((total, _FORMAT.row_dim), dtype=torch.bfloat16, device=dev)
    nbytes = total * nbytes_rec + total * _FORMAT.row_dim * 2 + table.numel() * 4
    run = {name: (lambda fn=fn: fn(cache, dst, table, ws, requests, starts)) for name, fn in impls.items()}
    return Workload(name=f"nvfp4_gather {requests} req x {context} ctx, bs {bs}", nbytes=nbytes, run=run)


def _realistic() -> gen.Nvfp4GatherSpec:
    """DeepSeek V3.2's shape, as the fp8 gather's bench: 64 requests of 4096 tokens, block size 64."""
    return gen.Nvfp4GatherSpec(
        requests=(gen.gather.GatherRequest(context_len=4096, length=4096),) * 64,
        paging=Paging(block_size=64, layout="shuffled"),
    )


NVFP4_GATHER = Op(
    name="nvfp4_gather",
    share=8,  # our CUDA gather, steady cases/s on an H100 (session 17): 1,628 on the fast path (663 while
    # the unwritten quarter took the full path); a share is ~200/s
    generator=gen.GENERATOR,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    defaults={"cpu": ("torch",), "cuda": ("cuda", "torch")},
    contract=frozenset({"wrong_dtype", "wrong_shape", "device_mismatch"}),  # SPEC 4's host checks, as the fp8 gather
    guarded=guarded,
    needs=gen.needs,
    loose=loose,
    call=CallShape(positional=("src_cache", "dst", "block_table", "workspace_starts", "batch_size", "seq_starts")),
    fast="nvfp4.gather",  # harness/fast/nvfp4/gather.py; the unwritten scale class takes the full path
    ours="cuda",
    vllm=(("vllm._custom_ops", "cp_gather_and_upconvert_nvfp4_kv_cache"),),
    bench=Bench(workload=_workload, realistic=_realistic, beside="gather"),
)
