"""Op definitions: how each op's case is drawn, called, and checked against its oracle.

One ``OpDef`` per op in the ``OP_DEFS`` registry; the runner and the fuzz loop
never branch on the op's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import SPEC_DRAWERS
from mlafuzz.harness.guards import Guarded, guarded_empty

Outputs = dict[str, "torch.Tensor | None"]

@dataclass(frozen=True, kw_only=True)
class OpDef:
    name: str
    invoke: Callable[[Callable, Case, Mapping[str, Any]], Outputs]  # (fn, case, cloned tensors) -> outputs
    oracle: Callable[[Case], Outputs]  # vectorized, for the hot path
    oracle_slow: Callable[[Case], Outputs]  # loop version, for minimized cases
    needs: Callable[[Case], frozenset[str]] = lambda case: frozenset()  # capabilities a case needs
    # Outputs the harness allocates, inside guard zones, filled with a byte pattern.
    guarded: Callable[[Case, int], dict[str, Guarded]] | None = None
    inplace: frozenset[str] = frozenset()  # inputs the op writes by design (not INPUT_MUTATION)
    # Re-files the first call's findings (the comparator's, or the EXCEPTION of a call that raised):
    # (case, call, findings, ctx) -> findings. The step op files metadata problems as METADATA_MISMATCH.
    review: Callable[[Case, Any, list, Any], list] | None = None
    # A fused exact check "outputs are what the oracle would give" (oracles/fast_*.py), used on
    # the GPU: yes skips the oracle and the comparator, no runs them for the finding. Its third
    # argument, when not None, is a second run's outputs over the other guard fill: then yes
    # also means both runs are bit-identical (the write map's question, answered in one pass).
    fast_match: Callable[[Case, Outputs, Outputs | None], bool] | None = None


# --- convert ---------------------------------------------------------------

def _convert_invoke(fn: Callable, case: Case, t: Mapping[str, Any]) -> Outputs:
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


def _convert_oracle(loop: bool) -> Callable[[Case], Outputs]:
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


def _convert_fast_match(case: Case, outputs: Outputs, second: Outputs | None = None) -> bool:
    from mlafuzz.oracles.fast_convert import convert_rows_match

    if second is not None:  # convert has no guarded outputs: never asked
        return False
    t, p = case.tensors, case.params
    out, counts = outputs.get("out"), outputs.get("valid_counts")
    if not isinstance(out, torch.Tensor) or (p["return_valid_counts"] and not isinstance(counts, torch.Tensor)):
        return False
    return convert_rows_match(req_id=t["req_id"], block_table=t["block_table"], token_indices=t["token_indices"],
                              block_size=p["BLOCK_SIZE"], has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
                              prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
                              prefill_workspace_starts=t["prefill_workspace_starts"], out=out,
                              valid_counts=counts if p["return_valid_counts"] else None)


# --- gather ----------------------------------------------------------------

def _gather_guarded(case: Case, fill: int) -> dict[str, Guarded]:
    # dst_* params exist only in error-input cases (a wrong dtype or width).
    p = case.params
    dtype = getattr(torch, p.get("dst_dtype", "bfloat16"))
    return {"dst": guarded_empty(shape=(p["total"], p.get("dst_cols", 576)), dtype=dtype, device=case.device,
                                 fill=fill)}


def _gather_invoke(fn: Callable, case: Case, t: Mapping[str, Any]) -> Outputs:
    dst = t["dst"]
    fn(t["src_cache"], dst, t["block_table"], t["workspace_starts"], case.params["batch_size"], t["seq_starts"])
    return {"dst": dst}


def _gather_oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles import gather as og

        fn = og.gather_loop if loop else og.gather
        t = case.tensors
        dst = fn(src_cache=t["src_cache"], block_table=t["block_table"], workspace_starts=t["workspace_starts"],
                 batch_size=case.params["batch_size"], seq_starts=t["seq_starts"], total=case.params["total"])
        return {"dst": dst}
    return run


def _gather_fast_match(case: Case, outputs: Outputs, second: Outputs | None = None) -> bool:
    from mlafuzz.oracles.fast_gather import gather_rows_match

    t = case.tensors
    return gather_rows_match(src_cache=t["src_cache"], dst=outputs["dst"], block_table=t["block_table"],
                             workspace_starts=t["workspace_starts"], batch_size=case.params["batch_size"],
                             seq_starts=t["seq_starts"], dst2=second["dst"] if second is not None else None)


def _gather_needs(case: Case) -> frozenset[str]:
    starts = case.tensors["seq_starts"]
    return frozenset({"seq_starts"}) if starts is not None and bool((starts != 0).any()) else frozenset()


# --- writer ----------------------------------------------------------------

def _writer_invoke(fn: Callable, case: Case, t: Mapping[str, Any]) -> Outputs:
    fn(t["kv_c"], t["k_pe"], t["kv_cache"], t["slot_mapping"], "fp8_ds_mla", t["scale"])
    return {"kv_cache": t["kv_cache"]}


def _writer_oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles import codec

        fn = codec.write_records_loop if loop else codec.write_records
        t = case.tensors
        return {"kv_cache": fn(kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache=t["kv_cache"], slot_mapping=t["slot_mapping"])}
    return run


def _writer_fast_match(case: Case, outputs: Outputs, second: Outputs | None = None) -> bool:
    from mlafuzz.oracles.fast_writer import writer_records_match

    if second is not None:  # the writer has no guarded outputs: never asked
        return False
    t, after = case.tensors, outputs.get("kv_cache")
    if not isinstance(after, torch.Tensor):
        return False
    return writer_records_match(kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache_before=t["kv_cache"],
                                kv_cache_after=after, slot_mapping=t["slot_mapping"])


OP_DEFS: dict[str, OpDef] = {
    "convert": OpDef(name="convert", invoke=_convert_invoke, oracle=_convert_oracle(False),
                     oracle_slow=_convert_oracle(True), fast_match=_convert_fast_match),
    "gather": OpDef(name="gather", invoke=_gather_invoke, oracle=_gather_oracle(False),
                    oracle_slow=_gather_oracle(True), needs=_gather_needs, guarded=_gather_guarded,
                    fast_match=_gather_fast_match),
    "writer": OpDef(name="writer", invoke=_writer_invoke, oracle=_writer_oracle(False),
                    oracle_slow=_writer_oracle(True), inplace=frozenset({"kv_cache"}),
                    fast_match=_writer_fast_match),
}


def fuzzable_ops() -> list[str]:
    """Ops the fuzz loop can draw cases for."""
    return [op for op in OP_DEFS if op in SPEC_DRAWERS]


import mlafuzz.harness.step_op  # noqa: E402,F401  (registers OP_DEFS["step"] and its reducer)
