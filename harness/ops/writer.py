"""The ``writer`` op's row of the op table (SPEC.md section 2, "Writer"): the call, the oracles,
defaults. The cache is written in place by design."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import writer as gen
from mlafuzz.harness.ops.op import CallShape, Op, Outputs


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    fn(t["kv_c"], t["k_pe"], t["kv_cache"], t["slot_mapping"], case.params.get("kv_cache_dtype", "fp8_ds_mla"),
       t["scale"])
    return {"kv_cache": t["kv_cache"]}


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles import codec

        fn = codec.write_records_loop if loop else codec.write_records
        t = case.tensors
        # TODO(revisions): the selected contract revision; 2026-07 until it is threaded through.
        return {"kv_cache": fn(kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache=t["kv_cache"], slot_mapping=t["slot_mapping"],
                               revision="2026-07")}
    return run


WRITER = Op(
    name="writer", spec_type=gen.WriterSpec, draw=gen.draw, materialize=gen.materialize, features=gen.features,
    size=gen.size, reduce=gen.reduce, invalid=gen.INVALID, oracle=_oracle(False), oracle_slow=_oracle(True),
    invoke=invoke, defaults={"cpu": ("torch",), "cuda": ("cuda", "torch")},
    contract=frozenset({"wrong_dtype", "wrong_shape"}),
    inplace=frozenset({"kv_cache"}),
    call=CallShape(positional=("kv_c", "k_pe", "kv_cache", "slot_mapping", "kv_cache_dtype", "scale")),
)
