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
from mlafuzz.harness.ops.op import CallShape, Op, Outputs


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


CONVERT = Op(
    name="convert",
    spec_type=gen.ConvertSpec,
    draw=gen.draw,
    materialize=gen.materialize,
    features=gen.features,
    size=gen.size,
    reduce=gen.reduce,
    invalid=gen.INVALID,
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
)
