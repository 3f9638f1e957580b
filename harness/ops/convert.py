"""The ``convert`` op's row of the op table (SPEC.md section 3): the call, the oracles, defaults.

SPEC section 7's options reach the call only when the case has them (``BLOCK_STRIDE_ROWS``,
``COMPACT_TO_FRONT`` in its params), so an implementation without them is called exactly as
before; ``needs`` and ``fit`` keep such cases away from it. A compacted ``out`` is compared row
by row as a multiset with a -1 tail (``row_sets``, the comparator's row-set mode), valid_counts
exactly. A row is compacted when the case passes ``COMPACT_TO_FRONT``, or when it is counted and
the case's revision's ``convert_counted`` rule is ``compact`` (vLLM 0.30.0 on: ``compacts``).

Caller-owned outputs (SPEC 9.2, the ``caller_out`` capability): in a case with ``out_steps`` in
its params, ``out`` and ``valid_counts`` are guarded outputs (harness/memory/guards.py, as
gather's ``dst``): row slices of buffers with rows before and after them, filled with each run's
byte pattern. The write map then finds an element never written (MISSING_WRITE) and a write
past the slice (OOB_WRITE); with two steps the first call's values must not survive the second
(a stale slot reads as a VALUE_MISMATCH). ``review`` holds the returned tensors to being the
caller's own (cause ``out:not_callers``). The GPU fast path judges them with a prefill instead (harness/fast/convert.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import convert as gen
from mlafuzz.generators.ops.convert_releases import DCP_PARAMS
from mlafuzz.generators.spec import Paging, TopkMode
from mlafuzz.harness.memory.guards import Guarded, guarded_set
from mlafuzz.harness.ops.op import Bench, CallShape, Op, Outputs, Workload
from mlafuzz.harness.ops.revision_hint import hint_revision
from mlafuzz.oracles import revisions
from mlafuzz.oracles.convert import rows_as_sets_equal
from mlafuzz.reports.findings import Finding, Kind

#: convert_counted rule -> whether a counted row is compacted (SPEC 10: vLLM 0.30.0 launches the
#: kernel with COMPACT_TO_FRONT = return_valid_counts). A rule value missing here is KeyError.
COUNTED = {"in_place": False, "compact": True}


def compacts(case: Case) -> bool:
    """Whether the case's ``out`` rows are compacted: asked for (``COMPACT_TO_FRONT``), or counted
    under a revision whose ``convert_counted`` rule compacts."""
    p = case.params
    if p.get("COMPACT_TO_FRONT"):
        return True
    rule = revisions.get(p.get("revision") or revisions.newest()).rule("convert_counted")
    return bool(p["return_valid_counts"]) and COUNTED[rule]


def guarded(case: Case, fill: int) -> dict[str, Guarded]:
    """The caller's ``out`` (and ``valid_counts_out`` when counts are asked for: vLLM ignores it
    otherwise) as row slices of guarded buffers, both in one fill; none when the case does not
    pass them."""
    p = case.params
    if "out_steps" not in p:
        return {}
    n, k = case.tensors["token_indices"].shape
    shapes = {"out": (n, k), **({"valid_counts": (n,)} if p["return_valid_counts"] else {})}
    return guarded_set(
        shapes=shapes,
        dtype=torch.int32,
        device=case.device,
        fill=fill,
        rows_before=p["out_rows_before"],
        rows_after=p["out_rows_after"],
    )


def caller_outputs(t: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords that hand the caller's buffers to the implementation (none: not passed)."""
    out = {"out": t["out"]} if "out" in t else {}
    return out | ({"valid_counts_out": t["valid_counts"]} if "valid_counts" in t else {})


def steps(case: Case, t: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The inputs of each call through the same buffers: the step before (its top-k rows
    ``prev_token_indices``) when the case has two, then the case's own."""
    prev = t.get("prev_token_indices")
    return ([{**t, "token_indices": prev}] if prev is not None else []) + [t]


def outputs(res: Any, counts: bool) -> Outputs:
    if counts:
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError(f"return_valid_counts=True must return (out, valid_counts), got {type(res).__name__}")
        return {"out": res[0], "valid_counts": res[1]}
    return {"out": res}


def release_args(case: Case, t: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of vLLM's releases the case passes (SPEC 10): ``idx_mapping`` and the DCP
    arguments, by vLLM's names; none where the case has none."""
    p = case.params
    out = {k: p[k] for k in DCP_PARAMS if k in p}
    return out | ({"idx_mapping": t["idx_mapping"]} if t.get("idx_mapping") is not None else {})


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    p = case.params
    options = {k: p[k] for k in ("BLOCK_STRIDE_ROWS", "COMPACT_TO_FRONT") if k in p}
    res = None
    for s in steps(case, t):
        res = fn(
            s["req_id"],
            s["block_table"],
            s["token_indices"],
            BLOCK_SIZE=p["BLOCK_SIZE"],
            NUM_TOPK_TOKENS=p["NUM_TOPK_TOKENS"],
            BLOCK_N=p["BLOCK_N"],
            HAS_PREFILL_WORKSPACE=p["HAS_PREFILL_WORKSPACE"],
            prefill_workspace_request_ids=s["prefill_workspace_request_ids"],
            prefill_workspace_starts=s["prefill_workspace_starts"],
            return_valid_counts=p["return_valid_counts"],
            **options,
            **caller_outputs(s),
            **release_args(case, s),
        )
    return outputs(res, p["return_valid_counts"])


def is_view_of(returned: Any, given: torch.Tensor) -> bool:
    """``returned`` is the tensor ``given`` (its address, shape, strides and dtype): the caller's
    own buffer, as SPEC 9.2 returns it (also the GPU fast path's check, harness/fast/convert.py)."""
    return (
        isinstance(returned, torch.Tensor)
        and returned.data_ptr() == given.data_ptr()
        and returned.shape == given.shape
        and returned.stride() == given.stride()
        and returned.dtype == given.dtype
    )


def _not_callers(call: Any, ctx: Any) -> list[Finding]:
    """SPEC 9.2: a call given ``out=`` / ``valid_counts_out=`` returns those tensors (vLLM's call
    site keeps reading its CUDA-graph-stable buffer, not whatever came back)."""
    return [
        ctx.finding(
            name,
            "not_callers",
            message=f"{name}: returned a tensor other than the caller's buffer it was given"
            f" ({'valid_counts_out' if name == 'valid_counts' else name}=, a row slice of a persistent buffer)",
        )
        for name, g in call.guards.items()
        if not is_view_of(call.outputs.get(name), g.view)
    ]


def _unwritten_out(
    case: Case, call: Any, both: Callable[[Case], tuple[Any, Any]], compact: bool, ctx: Any
) -> Finding | None:
    """Whether every difference of the caller's ``out`` is an element this call never wrote: one
    still holding the buffer's fill, or (two steps) the step before's value (a compacted row: in its
    -1 tail, or the whole row the step before's, in any order). Then ``out``'s value
    finding is the write map's MISSING_WRITE seen again (one cause, one bucket) and is dropped;
    stale values, which the write map cannot see, become a MISSING_WRITE of their own (None:
    none, the finding is dropped alone). Raises LookupError when something else differs."""
    g, act = call.guards["out"], call.outputs["out"]
    exp, counts = both(case)
    prev = case.tensors.get("prev_token_indices")
    before, before_counts = (
        both(dataclasses.replace(case, tensors={**case.tensors, "token_indices": prev}))
        if prev is not None
        else (None, None)
    )
    exp, act = exp.to(act.device), act.to(torch.int32)
    fill = int.from_bytes(bytes([g.fill] * 4), "little", signed=True)
    stale = (
        (act == before.to(act.device)) & (act != exp) if before is not None else torch.zeros_like(act, dtype=torch.bool)
    )
    explained = (act == fill) | stale
    if compact:  # the -1 tail, or a whole row as the step before left it, can be explained
        tail = torch.arange(act.shape[1], device=act.device) >= counts.to(act.device).reshape(-1, 1)
        explained &= tail
        fixed = torch.where(explained, torch.full_like(act, -1), act)
        rows = rows_as_sets_equal(expected=exp, actual=fixed, counts=counts).to(act.device)
        if before is not None:  # the step before's compacted row (in any order): none of it written now
            left = ~rows & rows_as_sets_equal(expected=before, actual=act, counts=before_counts).to(act.device)
            stale |= left.reshape(-1, 1) & (act != exp)
            explained |= stale & left.reshape(-1, 1)
            rows |= left
        ok = bool(rows.all())
    else:
        ok = bool(torch.where(explained, exp, act).eq(exp).all())
    if not ok:
        raise LookupError("out differs beyond its unwritten elements")
    n = int((stale & explained).sum())
    if not n:
        return None
    return ctx.finding(
        "out",
        "missing",
        kind=Kind.MISSING_WRITE,
        count=n,
        total=act.numel(),
        message=f"out: {n} / {act.numel()} elements still hold the step before's values (never written by this"
        " call, through the same caller-owned buffer)",
    )


def caller_review(
    both: Callable[[Case], tuple[Any, Any]], compact: Callable[[Case], bool]
) -> Callable[[Case, Any, list[Finding], Any], list[Finding]]:
    """The review of an op with caller-owned outputs: the returned tensors the caller's, and
    ``out``'s value findings that only restate unwritten or stale elements re-filed (see
    ``_unwritten_out``). ``both(case)``: the oracle's (out, valid_counts)."""

    def review(case: Case, call: Any, findings: list[Finding], ctx: Any) -> list[Finding]:
        if call.outputs is None or "out" not in call.guards:
            return findings
        values = [f for f in findings if f.kind is Kind.VALUE_MISMATCH and f.tensor == "out"]
        if values and isinstance(call.outputs.get("out"), torch.Tensor):
            try:
                stale = _unwritten_out(case, call, both, compact(case), ctx)
            except LookupError:
                pass
            else:
                findings = [f for f in findings if f not in values]
                if stale is not None:
                    findings.append(stale)
        return findings + _not_callers(call, ctx)

    return review


def oracle_inputs(case: Case) -> dict[str, Any]:
    """The case's inputs as the oracle (and the fast path's fused check) take them."""
    t, p = case.tensors, case.params
    return dict(
        req_id=t["req_id"],
        block_table=t["block_table"],
        token_indices=t["token_indices"],
        block_size=p["BLOCK_SIZE"],
        has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
        prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
        prefill_workspace_starts=t["prefill_workspace_starts"],
        block_stride_rows=p.get("BLOCK_STRIDE_ROWS"),
        # SPEC 10: vLLM's releases' arguments, at their defaults where the case passes none
        idx_mapping=t.get("idx_mapping"),
        dcp_size=p.get("dcp_size", 1),
        dcp_rank=p.get("dcp_rank", 0),
        dcp_interleave=p.get("cp_kv_cache_interleave_size", 1),
        prefill_rank_stride=p.get("prefill_workspace_rank_stride") or 0,  # vLLM launches None as 0
    )


def _both(case: Case, *, loop: bool) -> tuple[Any, Any]:
    """The oracle's (out, valid_counts) for the case, its options included."""
    from mlafuzz.oracles import convert as oc

    fn = oc.convert_loop if loop else oc.convert
    return fn(**oracle_inputs(case), compact_to_front=compacts(case))


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        out, counts = _both(case, loop=loop)
        return {"out": out, "valid_counts": counts} if case.params["return_valid_counts"] else {"out": out}

    return run


def row_sets(case: Case, expected: Mapping[str, Any]) -> Mapping[str, Any]:
    """A compacted ``out`` is a multiset per row (its order is unspecified): the comparator gets the
    oracle's count of each row's valid prefix. valid_counts itself stays an exact comparison."""
    if not compacts(case):
        return {}
    counts = expected.get("valid_counts")
    if counts is None:  # not asked of the implementation, still the length of each row's prefix
        counts = _both(case, loop=False)[1]
    return {"out": counts}


_caller_review = caller_review(lambda case: _both(case, loop=False), compacts)


def _same_rows(case: Case, expected: Any, actual: Any) -> bool:
    """``actual`` is ``expected`` as the case's revision judges it: row sets where rows compact."""
    if not isinstance(actual, torch.Tensor) or tuple(actual.shape) != tuple(expected.shape):
        return False
    if not compacts(case):
        return torch.equal(expected.cpu(), actual.detach().cpu().to(expected.dtype))
    counts = _both(case, loop=False)[1]
    return bool(rows_as_sets_equal(expected=expected, actual=actual, counts=counts).all())


def _review(case: Case, call: Any, findings: list[Finding], ctx: Any) -> list[Finding]:
    """The caller-owned outputs' review, then the revision hint: a counted ``out`` that another
    revision's ``convert_counted`` rule makes (an in-place convert judged under ``compact``, or the
    reverse) says which revision it matches (harness/ops/revision_hint.py)."""
    findings = _caller_review(case, call, findings, ctx)
    if not case.params["return_valid_counts"] or case.params.get("COMPACT_TO_FRONT"):
        return findings  # the rule decides nothing here: every revision's oracle is the same
    return hint_revision(
        case, call, findings, oracle=_oracle(False), output="out", rule="convert_counted", same=_same_rows
    )


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


# A row's slots and its count of valid ones: one row converted wrong is one cause (check/linked.py).
LINKED = ("out", "valid_counts")

CONVERT = Op(
    name="convert",
    share=8,  # H200 steady cases/s, docs/performance.md: 1,590 (bench, size large); a share is ~200/s
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
    guarded=guarded,
    review=_review,
    linked=LINKED,
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
    vllm_devices=frozenset({"cpu", "cuda"}),  # Triton: interpreted on the CPU (the release tier)
    bench=Bench(workload=_workload, realistic=_realistic),
)
