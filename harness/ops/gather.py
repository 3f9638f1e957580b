"""The ``gather`` op's row of the op table (SPEC.md section 4): the call, its guarded ``dst``, the
oracles, defaults. The host tier's tensors (SPEC 9.3) are inputs like the others: the detectors
hold every tensor of the case unchanged (INPUT_MUTATION), the pinned host cache included."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import gather as gen
from mlafuzz.harness.memory.guards import Guarded, guarded_empty
from mlafuzz.harness.ops.op import CallShape, Op, Outputs


def guarded(case: Case, fill: int, fill_region: bool = True) -> dict[str, Guarded]:
    # dst_dtype / dst_cols exist only in error-input cases (a wrong dtype or width); dst_rows_* when
    # dst is a row slice of a larger workspace (GatherSpec.dst_view), whose other rows it must not write.
    p = case.params
    dtype = getattr(torch, p.get("dst_dtype", "bfloat16"))
    return {
        "dst": guarded_empty(
            shape=(p["total"], p.get("dst_cols", 576)),
            dtype=dtype,
            device=case.device,
            fill=fill,
            fill_region=fill_region,
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


GATHER = Op(
    name="gather",
    spec_type=gen.GatherSpec,
    draw=gen.draw,
    materialize=gen.materialize,
    features=gen.features,
    size=gen.size,
    reduce=gen.reduce,
    invalid=gen.INVALID,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    defaults={"cpu": ("torch",), "cuda": ("cuda", "torch")},
    contract=frozenset({"wrong_dtype", "wrong_shape", "device_mismatch"}),  # SPEC 4: what vLLM checks on the host
    guarded=guarded,
    needs=gen.needs,
    fit=gen.fit,
    call=CallShape(positional=("src_cache", "dst", "block_table", "workspace_starts", "batch_size", "seq_starts")),
)
