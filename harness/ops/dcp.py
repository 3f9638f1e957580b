"""The DCP ops' rows of the op table (SPEC.md section 9.4): ``dcp``, vLLM's
``triton_filter_and_convert_dcp_index``, and ``dcp_peer``, vLLM's
``convert_global_indices_to_dcp_peer_slots``, each called with vLLM's own signature (why two rows
and not convert options: generators/ops/dcp.py).

A compacted ``dcp`` row is compared as a multiset with a -1 tail (the comparator's row-set mode),
valid_counts exactly. Which rows are compacted is ``compacts``: at D = 1 vLLM's function hands the
call to the plain convert (oracles/dcp.py ``filter_compacts``), whose rule for a counted row is the
case's revision's ``convert_counted``. ``BLOCK_STRIDE_ROWS`` (vLLM 0.29.0) reaches the call only
when the case has it (the ``block_stride_rows`` capability, as convert's). ``dcp_peer`` takes SPEC 9.2's caller-owned outputs as convert does (the
``caller_out`` capability; guarded buffers, two steps, the returned tensors the caller's:
harness/ops/convert.py).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import dcp as gen
from mlafuzz.harness.ops import convert as cv
from mlafuzz.harness.ops.op import CallShape, Op, Outputs
from mlafuzz.harness.ops.revision_hint import hint_revision
from mlafuzz.oracles import revisions


def compacts(case: Case) -> bool:
    """Whether the case's filter rows are packed to the front (oracles/dcp.py ``filter_compacts``)."""
    from mlafuzz.oracles.dcp import filter_compacts

    p = case.params
    return filter_compacts(
        dcp_size=p["dcp_size"],
        compact_valid_to_front=p["compact_valid_to_front"],
        return_valid_counts=p["return_valid_counts"],
        convert_counted=revisions.get(p.get("revision") or revisions.newest()).rule("convert_counted"),
    )


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    p = case.params
    stride = {"BLOCK_STRIDE_ROWS": p["BLOCK_STRIDE_ROWS"]} if "BLOCK_STRIDE_ROWS" in p else {}
    res = fn(
        t["req_id"],
        t["block_table"],
        t["token_indices"],
        p["dcp_size"],
        p["dcp_rank"],
        cp_kv_cache_interleave_size=p["cp_kv_cache_interleave_size"],
        BLOCK_SIZE=p["BLOCK_SIZE"],
        NUM_TOPK_TOKENS=p["NUM_TOPK_TOKENS"],
        BLOCK_N=p["BLOCK_N"],
        return_valid_counts=p["return_valid_counts"],
        compact_valid_to_front=p["compact_valid_to_front"],
        **stride,
    )
    return cv.outputs(res, p["return_valid_counts"])


def invoke_peer(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    p = case.params
    res = None
    for s in cv.steps(case, t):
        res = fn(
            s["req_id"],
            s["block_table"],
            s["token_indices"],
            dcp_size=p["dcp_size"],
            blocks_per_peer=p["blocks_per_peer"],
            cp_kv_cache_interleave_size=p["cp_kv_cache_interleave_size"],
            block_size=p["block_size"],
            BLOCK_N=p["BLOCK_N"],
            return_valid_counts=p["return_valid_counts"],
            **cv.caller_outputs(s),
        )
    return cv.outputs(res, p["return_valid_counts"])


# The vectorized filter's last case and result: a compacted case whose call returns no counts asks
# for them again (``row_sets``) right after the oracle ran, and each run is ~30 launches on a GPU.
# One tuple, swapped whole; a hit is the same case object, so it is never another case's result.
_last: tuple[Case | None, Any] = (None, None)


def filter_slots(case: Case, *, loop: bool, compact: bool | None = None) -> tuple[Any, Any]:
    """The dcp oracle's (out, valid_counts) for the case: the loop or the vectorized filter,
    compacted as ``compacts`` says unless ``compact`` does (the fast path's check asks for the
    uncompacted rows, on the case's device)."""
    from mlafuzz.oracles import dcp as od

    t, p = case.tensors, case.params
    return (od.dcp_filter_loop if loop else od.dcp_filter)(
        req_id=t["req_id"],
        block_table=t["block_table"],
        token_indices=t["token_indices"],
        block_size=p["BLOCK_SIZE"],
        dcp_size=p["dcp_size"],
        dcp_rank=p["dcp_rank"],
        interleave=p["cp_kv_cache_interleave_size"],
        compact=compacts(case) if compact is None else compact,
        block_stride=p.get("BLOCK_STRIDE_ROWS"),
    )


def _filter(case: Case, *, loop: bool) -> tuple[Any, Any]:
    global _last
    if not loop and _last[0] is case:
        return _last[1]
    res = filter_slots(case, loop=loop)
    if not loop:
        _last = (case, res)
    return res


def peer_slots(case: Case, *, loop: bool) -> tuple[Any, Any]:
    """The dcp_peer oracle's (out, valid_counts) for the case: the loop or the vectorized one (the
    fast path's check runs the latter on the case's device)."""
    from mlafuzz.oracles import dcp as od

    t, p = case.tensors, case.params
    return (od.dcp_peer_slots_loop if loop else od.dcp_peer_slots)(
        req_id=t["req_id"],
        block_table=t["block_table"],
        token_indices=t["token_indices"],
        block_size=p["block_size"],
        dcp_size=p["dcp_size"],
        interleave=p["cp_kv_cache_interleave_size"],
        blocks_per_peer=p["blocks_per_peer"],
    )


def _oracle(both: Callable[..., tuple[Any, Any]], loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        out, counts = both(case, loop=loop)
        return {"out": out, "valid_counts": counts} if case.params["return_valid_counts"] else {"out": out}

    return run


def row_sets(case: Case, expected: Mapping[str, Any]) -> Mapping[str, Any]:
    """A compacted ``out``: each row a multiset of its first valid_counts values, -1 after."""
    if not compacts(case):
        return {}
    counts = expected.get("valid_counts")
    return {"out": counts if counts is not None else _filter(case, loop=False)[1]}


def review(case: Case, call: Any, findings: list, ctx: Any) -> list:
    """A mismatching ``out`` that another revision's ``convert_counted`` makes exactly says so (a
    D = 1 counted row packed by a vLLM of 0.30.0 on, judged under an in-place revision)."""
    return hint_revision(case, call, findings, oracle=_oracle(_filter, False), output="out", rule="convert_counted")


DCP = Op(
    name="dcp",
    share=10,  # H200 steady cases/s, docs/performance.md: 1,976 (the fast path, session 15); a share is ~200/s
    generator=gen.GENERATOR,
    oracle=_oracle(_filter, False),
    oracle_slow=_oracle(_filter, True),
    invoke=invoke,
    defaults={"cpu": ("triton", "torch"), "cuda": ("triton", "torch")},
    # What vLLM's filter asserts on the host.
    contract=frozenset(
        {
            "wrong_dtype",
            "k_mismatch",
            "k_not_multiple_of_block_n",
            "bad_dcp_size",
            "bad_dcp_rank",
            "interleave_not_dividing_block",
        }
    ),
    row_sets=row_sets,
    review=review,
    needs=gen.needs,
    fit=gen.fit,
    linked=cv.LINKED,
    call=CallShape(
        positional=("req_id", "block_table", "token_indices", "dcp_size", "dcp_rank"),
        keywords=(
            "cp_kv_cache_interleave_size",
            "BLOCK_SIZE",
            "NUM_TOPK_TOKENS",
            "BLOCK_N",
            "return_valid_counts",
            "compact_valid_to_front",
        ),
    ),
    ours="triton",
    fast="dcp",  # the GPU fast path's check: harness/fast/dcp.py
    # SPEC 9.4's DCP filter (sparse_utils.py).
    vllm=(("vllm.v1.attention.backends.mla.sparse_utils", "triton_filter_and_convert_dcp_index"),),
    vllm_devices=frozenset({"cpu", "cuda"}),  # Triton: interpreted on the CPU (the release tier)
)

DCP_PEER = Op(
    name="dcp_peer",
    share=8,  # H200 steady cases/s, docs/performance.md: 1,615; a share is ~200/s
    generator=gen.GENERATOR_PEER,
    oracle=_oracle(peer_slots, False),
    oracle_slow=_oracle(peer_slots, True),
    invoke=invoke_peer,
    defaults={"cpu": ("torch",), "cuda": ("torch",)},
    # What vLLM's peer-slot map checks on the host (its tests: ValueError for each).
    contract=frozenset(
        {"bad_dcp_size", "bad_blocks_per_peer", "interleave_not_dividing_block", "bad_block_n", "peer_space_overflow"}
    ),
    guarded=cv.guarded,
    review=cv.caller_review(lambda case: peer_slots(case, loop=False), lambda case: False),
    linked=cv.LINKED,
    needs=gen.needs_peer,
    fit=gen.fit_peer,
    call=CallShape(
        positional=("req_id", "block_table", "token_indices"),
        keywords=(
            "dcp_size",
            "blocks_per_peer",
            "cp_kv_cache_interleave_size",
            "block_size",
            "BLOCK_N",
            "return_valid_counts",
        ),
    ),
    ours="torch",
    fast="dcp_peer",  # the GPU fast path's check: harness/fast/dcp_peer.py
    # SPEC 9.4's peer-slot variant, read from a stored sparse_utils.py (index id 54580894472) and a
    # test file of unconfirmed origin (index id 56361940756): no vLLM release 0.27.0-0.34.0 has it
    # (SPEC 10), so --impl dcp_peer=vllm finds it only in a vLLM built from such a source.
    vllm=(("vllm.v1.attention.backends.mla.sparse_utils", "convert_global_indices_to_dcp_peer_slots"),),
)
