"""The ``convert`` op's row of the op table (SPEC.md section 3): the call, the oracles, defaults.

SPEC section 7's options reach the call only when the case has them (``BLOCK_STRIDE_ROWS``,
``COMPACT_TO_FRONT`` in its params), so an implementation without them is called exactly as
before; ``needs`` and ``fit`` keep such cases away from it. A compacted ``out`` is compared row
by row as a multiset with a -1 tail (``row_sets``, the comparator's row-set mode), valid_counts
exactly.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import convert as gen
from mlafuzz.generators.spec import Paging, TopkMode
from mlafuzz.harness.ops.op import Bench, CallShape, Op, Outputs, Workload


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    p = case.params
    options = {k: p[k] for k in ("BLOCK_STRIDE_ROWS", "COMPACT_TO_FRONT") if k in p}
    res = fn(
        t["req_id"],
        t["block_table"],
        t["token_indices"],
        BLOCK_SIZE=p["BLOCK_SIZE"],
        NUM_TOPK_TOKENS=p["NUM_TOPK_TOKENS"],
        BLOCK_N=p["BLOCK_N"],
        HAS_PREFILL_WORKSPACE=p["HAS_PREFILL_WORKSPACE"],
        prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
        prefill_workspace_starts=t["prefill_workspace_starts"],
        return_valid_counts=p["return_valid_counts"],
        **options,
    )
    if p["return_valid_counts"]:
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError(f"return_valid_counts=True must return (out, valid_counts), got {type(res).__name__}")
        return {"out": res[0], "valid_counts": res[1]}
    return {"out": res}


def _both(case: Case, *, loop: bool) -> tuple[Any, Any]:
    """The oracle's (out, valid_counts) for the case, its options included."""
    from mlafuzz.oracles import convert as oc

    fn = oc.convert_loop if loop else oc.convert
    t, p = case.tensors, case.params
    return fn(
        req_id=t["req_id"],
        block_table=t["block_table"],
        token_indices=t["token_indices"],
        block_size=p["BLOCK_SIZE"],
        has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
        prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
        prefill_workspace_starts=t["prefill_workspace_starts"],
        block_stride_rows=p.get("BLOCK_STRIDE_ROWS"),
        compact_to_front=bool(p.get("COMPACT_TO_FRONT")),
    )


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        out, counts = _both(case, loop=loop)
        return {"out": out, "valid_counts": counts} if case.params["return_valid_counts"] else {"out": out}

    return run


def row_sets(case: Case, expected: Mapping[str, Any]) -> Mapping[str, Any]:
    """A compacted ``out`` is a multiset per row (its order is unspecified): the comparator gets the
    oracle's count of each row's valid prefix. valid_counts itself stays an exact comparison."""
    if not case.params.get("COMPACT_TO_FRONT"):
        return {}
    counts = expected.get("valid_counts")
    if counts is None:  # not asked of the implementation, still the length of each row's prefix
        counts = _both(case, loop=False)[1]
    return {"out": counts}


def _workload(impls: dict[str, Callable], *, tokens: int = 4096, k: int = 2048, bs: int = 64) -> Workload:
    """bench: 4096 tokens' top-2048 indices through 64 requests' block tables."""
    import torch

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    requests, seq = 64, 8192
    table = torch.randint(0, 1 << 16, (requests, seq // bs), dtype=torch.int32, device=dev, generator=g)
    req = torch.randint(0, requests, (tokens,), dtype=torch.int32, device=dev, generator=g)
    idx = torch.randint(-1, seq, (tokens, k), dtype=torch.int32, device=dev, generator=g)
    nbytes = idx.numel() * 4 * 2 + tokens * 4 * 2  # indices in, slots out, req in, counts out
    run = {
        name: (
            lambda fn=fn: fn(req, table, idx, BLOCK_SIZE=bs, NUM_TOPK_TOKENS=k, BLOCK_N=128, return_valid_counts=True)
        )
        for name, fn in impls.items()
    }
    return Workload(name=f"convert {tokens} tokens x K {k}", nbytes=nbytes, run=run)


def _realistic() -> gen.ConvertSpec:
    """DeepSeek V3.2's shape: K 2048, BLOCK_N 128, 64 requests of 64 tokens over 8192, block size 64."""
    return gen.ConvertSpec(
        requests=(gen.ConvertRequest(seq_len=8192, num_tokens=64),) * 64,
        paging=Paging(block_size=64, layout="shuffled"),
        topk=2048,
        block_n=128,
        topk_mode=TopkMode.PADDED,
    )


CONVERT = Op(
    name="convert",
    generator=gen.GENERATOR,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    defaults={"cpu": ("triton", "torch"), "cuda": ("triton", "torch")},
    # SPEC 3's "must reject with a clear exception before launching" (the PR #48642 fix).
    contract=frozenset({"length_mismatch", "wrong_dtype", "k_mismatch", "k_not_multiple_of_block_n"}),
    needs=gen.needs,
    fit=gen.fit,
    row_sets=row_sets,
    call=CallShape(
        positional=("req_id", "block_table", "token_indices"),
        keywords=(
            "BLOCK_SIZE",
            "NUM_TOPK_TOKENS",
            "BLOCK_N",
            "HAS_PREFILL_WORKSPACE",
            "prefill_workspace_request_ids",
            "prefill_workspace_starts",
            "return_valid_counts",
        ),
    ),
    fast="convert",
    ours="triton",
    vllm=(
        ("vllm.v1.attention.backends.mla.flashmla_sparse", "triton_convert_req_index_to_global_index"),
        ("vllm.v1.attention.backends.mla.sparse_utils", "triton_convert_req_index_to_global_index"),
    ),
    bench=Bench(workload=_workload, realistic=_realistic),
)
