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
    # Outputs the harness allocates, inside guard zones, filled with a byte pattern:
    # (case, fill, fill_region=True) -> guards; fill_region=False leaves the outputs' own bytes
    # unfilled, for fast_prefill.
    guarded: Callable[..., dict[str, Guarded]] | None = None
    inplace: frozenset[str] = frozenset()  # inputs the op writes by design (not INPUT_MUTATION)
    # Re-files the first call's findings (the comparator's, or the EXCEPTION of a call that raised):
    # (case, call, findings, ctx) -> findings. The step op files metadata problems as METADATA_MISMATCH.
    review: Callable[[Case, Any, list, Any], list] | None = None
    # The GPU fast path (oracles/fast_*.py; harness.runner). fast_check(case, outputs, second, flag):
    # a fused exact check of the outputs against what the oracle would give, written into
    # ``flag`` (a zeroed device int64 [2]; the larger of its elements counts): 0 exactly the
    # oracle's (and, given a guarded op's second run, that run's too, bit-identical to the
    # first), 1 they differ, 2 a case this check does not handle. It returns False, launching
    # nothing, when it can tell so on the host. The runner reads all of a case's flags in one
    # sync and sends any case with a raised flag to the full path (oracle, comparator, two-run
    # write map).
    fast_check: Callable[[Case, Outputs, Outputs | None, torch.Tensor], bool] | None = None
    # Fills the guarded outputs' regions so that no byte holds its expected value: then an output
    # the fast check passes was written at every byte, in one run. False: it cannot (the
    # regions are then filled with the constant pattern and the case takes the full path).
    fast_prefill: Callable[[Case, Mapping[str, Guarded]], bool] | None = None


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


def _convert_fast_check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor) -> bool:
    from mlafuzz.oracles.fast_convert import convert_rows_flag

    if second is not None:  # convert has no guarded outputs: never asked
        return False
    t, p = case.tensors, case.params
    out, counts = outputs.get("out"), outputs.get("valid_counts")
    if not isinstance(out, torch.Tensor) or (p["return_valid_counts"] and not isinstance(counts, torch.Tensor)):
        return False
    return convert_rows_flag(req_id=t["req_id"], block_table=t["block_table"], token_indices=t["token_indices"],
                             block_size=p["BLOCK_SIZE"], has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
                             prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
                             prefill_workspace_starts=t["prefill_workspace_starts"], out=out,
                             valid_counts=counts if p["return_valid_counts"] else None, flag=flag) is not None


# --- gather ----------------------------------------------------------------

def _gather_guarded(case: Case, fill: int, fill_region: bool = True) -> dict[str, Guarded]:
    # dst_* params exist only in error-input cases (a wrong dtype or width).
    p = case.params
    dtype = getattr(torch, p.get("dst_dtype", "bfloat16"))
    return {"dst": guarded_empty(shape=(p["total"], p.get("dst_cols", 576)), dtype=dtype, device=case.device,
                                 fill=fill, fill_region=fill_region)}


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


def _gather_fast_args(case: Case) -> dict[str, Any]:
    """The fused gather check's arguments, prepared once per case for its prefill and its check:
    the cache contiguous and aligned (a copy only when it is not), and the row -> record map."""
    from mlafuzz.oracles.fast_gather import contiguous_records, record_offsets

    t = case.tensors
    args = dict(block_table=t["block_table"], workspace_starts=t["workspace_starts"],
                batch_size=case.params["batch_size"], seq_starts=t["seq_starts"])
    if "gather_fast" not in case.memo:
        cache = contiguous_records(t["src_cache"])
        rec = (record_offsets(src_cache=cache, total=case.params["total"], **args) if cache is not None
               else None)  # a cache of another shape: prefill and check decline it themselves
        case.memo["gather_fast"] = (cache if cache is not None else t["src_cache"], rec)
    cache, rec = case.memo["gather_fast"]
    return {**args, "src_cache": cache, "rec": rec}


def _gather_fast_check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor) -> bool:
    from mlafuzz.oracles.fast_gather import gather_rows_flag

    dst = outputs.get("dst")
    dst2 = second.get("dst") if second is not None else None
    if not isinstance(dst, torch.Tensor) or (second is not None and not isinstance(dst2, torch.Tensor)):
        return False
    return gather_rows_flag(dst=dst, dst2=dst2, flag=flag, **_gather_fast_args(case)) is not None


def _gather_fast_prefill(case: Case, guards: Mapping[str, Guarded]) -> bool:
    from mlafuzz.oracles.fast_gather import gather_prefill

    return gather_prefill(dst=guards["dst"].view, **_gather_fast_args(case))


def _gather_needs(case: Case) -> frozenset[str]:
    starts = case.tensors["seq_starts"]
    return frozenset({"seq_starts"}) if starts is not None and bool((starts != 0).any()) else frozenset()


# --- writer ----------------------------------------------------------------

def _writer_invoke(fn: Callable, case: Case, t: Mapping[str, Any]) -> Outputs:
    fn(t["kv_c"], t["k_pe"], t["kv_cache"], t["slot_mapping"], "fp8_ds_mla", t["scale"])
    return {"kv_cache": t["kv_cache"]}


# The writer contract revision the harness judges by (SPEC section 7). Pinned to
# 2026-07 because every writer we ship (torch, CUDA), the fused fast check and
# the mutant catalog implement it, while the oracles now default to the newest
# (2026-09). TODO: take it from the registry entry's contract instead.
WRITER_REVISION = "2026-07"


def _writer_oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles import codec

        fn = codec.write_records_loop if loop else codec.write_records
        t = case.tensors
        return {"kv_cache": fn(kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache=t["kv_cache"], slot_mapping=t["slot_mapping"],
                               revision=WRITER_REVISION)}
    return run


def _writer_fast_check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor) -> bool:
    from mlafuzz.oracles.fast_writer import writer_records_flag

    if second is not None:  # the writer has no guarded outputs: never asked
        return False
    t, after = case.tensors, outputs.get("kv_cache")
    if not isinstance(after, torch.Tensor):
        return False
    return writer_records_flag(kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache_before=t["kv_cache"],
                               kv_cache_after=after, slot_mapping=t["slot_mapping"],
                               flag=flag) is not None


OP_DEFS: dict[str, OpDef] = {
    "convert": OpDef(name="convert", invoke=_convert_invoke, oracle=_convert_oracle(False),
                     oracle_slow=_convert_oracle(True), fast_check=_convert_fast_check),
    "gather": OpDef(name="gather", invoke=_gather_invoke, oracle=_gather_oracle(False),
                    oracle_slow=_gather_oracle(True), needs=_gather_needs, guarded=_gather_guarded,
                    fast_check=_gather_fast_check, fast_prefill=_gather_fast_prefill),
    "writer": OpDef(name="writer", invoke=_writer_invoke, oracle=_writer_oracle(False),
                    oracle_slow=_writer_oracle(True), inplace=frozenset({"kv_cache"}),
                    fast_check=_writer_fast_check),
}


def fuzzable_ops() -> list[str]:
    """Ops the fuzz loop can draw cases for."""
    return [op for op in OP_DEFS if op in SPEC_DRAWERS]


import mlafuzz.harness.step_op  # noqa: E402,F401  (registers OP_DEFS["step"] and its reducer)
