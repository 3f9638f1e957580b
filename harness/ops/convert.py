"""The ``convert`` op's row of the op table (SPEC.md section 3): the call, the oracles, defaults."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import convert as gen
from mlafuzz.harness.ops.op import CallShape, Op, Outputs


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    p = case.params
    res = fn(t["req_id"], t["block_table"], t["token_indices"], BLOCK_SIZE=p["BLOCK_SIZE"],
             NUM_TOPK_TOKENS=p["NUM_TOPK_TOKENS"], BLOCK_N=p["BLOCK_N"],
             HAS_PREFILL_WORKSPACE=p["HAS_PREFILL_WORKSPACE"],
             prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
             prefill_workspace_starts=t["prefill_workspace_starts"],
             return_valid_counts=p["return_valid_counts"])
    if p["return_valid_counts"]:
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError(f"return_valid_counts=True must return (out, valid_counts), got {type(res).__name__}")
        return {"out": res[0], "valid_counts": res[1]}
    return {"out": res}


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles import convert as oc

        fn = oc.convert_loop if loop else oc.convert
        t, p = case.tensors, case.params
        out, counts = fn(req_id=t["req_id"], block_table=t["block_table"], token_indices=t["token_indices"],
                         block_size=p["BLOCK_SIZE"], has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
                         prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
                         prefill_workspace_starts=t["prefill_workspace_starts"])
        return {"out": out, "valid_counts": counts} if p["return_valid_counts"] else {"out": out}
    return run


CONVERT = Op(
    name="convert", spec_type=gen.ConvertSpec, draw=gen.draw, materialize=gen.materialize, features=gen.features,
    size=gen.size, reduce=gen.reduce, invalid=gen.INVALID, oracle=_oracle(False), oracle_slow=_oracle(True),
    invoke=invoke, defaults={"cpu": ("triton", "torch"), "cuda": ("triton", "torch")},
    # SPEC 3's "must reject with a clear exception before launching" (the PR #48642 fix).
    contract=frozenset({"length_mismatch", "wrong_dtype", "k_mismatch", "k_not_multiple_of_block_n"}),
    call=CallShape(positional=("req_id", "block_table", "token_indices"),
                   keywords=("BLOCK_SIZE", "NUM_TOPK_TOKENS", "BLOCK_N", "HAS_PREFILL_WORKSPACE",
                             "prefill_workspace_request_ids", "prefill_workspace_starts", "return_valid_counts")),
)
