"""The ``gather`` op's row of the op table (SPEC.md section 4): the call, its guarded ``dst``, the
oracles, defaults. The host tier's tensors (SPEC 9.3) are inputs like the others: the detectors
hold every tensor of the case unchanged (INPUT_MUTATION), the pinned host cache included."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import gather as gen
from mlafuzz.generators.spec import Paging, ValueMode
from mlafuzz.harness.memory.guards import Guarded, guarded_empty
from mlafuzz.harness.ops.op import Bench, CallShape, Op, Outputs, Workload
from mlafuzz.oracles.formats import table as formats

FORMAT = formats.get("fp8_ds_mla")  # the records this op reads


def guarded(case: Case, fill: int) -> dict[str, Guarded]:
    # dst_dtype / dst_cols exist only in error-input cases (a wrong dtype or width); dst_rows_* when
    # dst is a row slice of a larger workspace (GatherSpec.dst_view), whose other rows it must not write.
    p = case.params
    dtype = getattr(torch, p.get("dst_dtype", "bfloat16"))
    return {
        "dst": guarded_empty(
            shape=(p["total"], p.get("dst_cols", FORMAT.row_dim)),
            dtype=dtype,
            device=case.device,
            fill=fill,
            rows_before=p.get("dst_rows_before", 0),
            rows_after=p.get("dst_rows_after", 0),
        )
    }


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    dst = t["dst"]
    # The host tier's three (SPEC 9.3) go by keyword, as vLLM's call site passes them, and only to a
    # case that has them (``needs``/``fit`` keep such cases from implementations without them).
    host = {k: t.get(k) for k in gen.HOST_ARGS} if any(t.get(k) is not None for k in gen.HOST_ARGS) else {}
    fn(t["src_cache"], dst, t["block_table"], t["workspace_starts"], case.params["batch_size"], t["seq_starts"], **host)
    return {"dst": dst}


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles import gather as og

        fn = og.gather_loop if loop else og.gather
        t = case.tensors
        dst = fn(
            src_cache=t["src_cache"],
            block_table=t["block_table"],
            workspace_starts=t["workspace_starts"],
            batch_size=case.params["batch_size"],
            seq_starts=t["seq_starts"],
            total=case.params["total"],
            **{k: t.get(k) for k in gen.HOST_ARGS},
        )
        return {"dst": dst}

    return run


def _workload(impls: dict[str, Callable], *, requests: int = 64, context: int = 4096, bs: int = 64) -> Workload:
    """bench: the gather of 64 requests of 4096 tokens each from a shuffled paged cache."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    blocks_per_req = context // bs
    num_blocks = requests * blocks_per_req
    cache = torch.randint(0, 256, (num_blocks, bs, FORMAT.record_bytes), dtype=torch.uint8, device=dev, generator=g)
    # Finite scales, so the timed math is the common path.
    scale = FORMAT.plane("scale")
    cache[..., scale.offset : scale.stop] = torch.full((scale.elements,), 0.01, device=dev).view(torch.uint8)
    table = torch.randperm(num_blocks, device=dev, generator=g).to(torch.int32).reshape(requests, blocks_per_req)
    ws = torch.arange(requests, device=dev, dtype=torch.int32) * context
    starts = torch.zeros(requests, dtype=torch.int32, device=dev)
    total = requests * context
    dst = torch.empty((total, FORMAT.row_dim), dtype=torch.bfloat16, device=dev)
    nbytes = total * FORMAT.record_bytes + total * FORMAT.row_dim * 2 + table.numel() * 4
    run = {name: (lambda fn=fn: fn(cache, dst, table, ws, requests, starts)) for name, fn in impls.items()}
    return Workload(name=f"gather {requests} req x {context} ctx, bs {bs}", nbytes=nbytes, run=run)


def _variants() -> dict[str, Callable]:
    """bench --variants: every tuning variant of our CUDA gather (rows per warp x streaming hints)."""
    import functools

    from mlafuzz.kernels import cuda_ext

    return {
        f"rows{rows}{'+cs' if hints else ''}": functools.partial(
            cuda_ext.gather_impl, rows_per_warp=rows, stream_hints=hints
        )
        for rows in cuda_ext.GATHER_ROWS_CHOICES
        for hints in (False, True)
    }


def _realistic() -> gen.GatherSpec:
    """DeepSeek V3.2's shape: 64 requests of 4096 tokens, block size 64, a shuffled block table."""
    return gen.GatherSpec(
        requests=(gen.GatherRequest(context_len=4096, length=4096),) * 64,
        paging=Paging(block_size=64, layout="shuffled"),
        values=ValueMode.ALL_CODES,
    )


GATHER = Op(
    name="gather",
    share=6,  # H200 steady cases/s, docs/performance.md: 1,109 (bench, size large); a share is ~200/s
    generator=gen.GENERATOR,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    defaults={"cpu": ("torch",), "cuda": ("cuda", "torch")},
    contract=frozenset({"wrong_dtype", "wrong_shape", "device_mismatch"}),  # SPEC 4: what vLLM checks on the host
    guarded=guarded,
    needs=gen.needs,
    fit=gen.fit,
    call=CallShape(positional=("src_cache", "dst", "block_table", "workspace_starts", "batch_size", "seq_starts")),
    fast="gather",
    ours="cuda",
    vllm=(("vllm._custom_ops", "cp_gather_and_upconvert_fp8_kv_cache"),),
    bench=Bench(workload=_workload, realistic=_realistic, variants=_variants),
)
