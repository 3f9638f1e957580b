"""The ``plan`` op's row of the op table: the packing chunk planner of SPEC.md section 9.1, checked
against oracles.plan.

Call. ``fn(context_lens, row_budget, max_context_chunk, split_alignment, padded_rows)``, by
position as vLLM's call site calls ``plan_mla_context_chunks``: ``context_lens`` a fresh list of
ints (one the planner may not change), ``padded_rows`` a callable (the identity without DCP,
``ceil(r / (D*I)) * I`` with it). It returns a sequence of chunks. A chunk may be an object with
attributes (vLLM's ``_ContextChunkPlan``, ours), a mapping with those keys, or a 5-tuple in the
order ``(request_start, request_end, starts, seq_lens, is_continuation)``; ``invoke`` reads each
form into the same tensors:

- ``chunks`` int32 [n, 3]: request_start, request_end, is_continuation;
- ``starts`` / ``seq_lens`` int32 [sum of the chunks' request counts], chunk after chunk;
- ``invariants`` int32 flags (the oracle's all ones): SPEC 9.1's invariants of the returned plan
  (``oracles.plan.problems``), whatever the rule, and ``input_unchanged``.

Findings (``review_plan``): a plan that is not the rule's, or breaks an invariant, is a
METADATA_MISMATCH (one per broken invariant, cause ``plan:<name>``; else one for the plan, named
after its first differing chunk), with the tensor mismatches folded in; a chunk that cannot be
read is a METADATA_MISMATCH (``plan:shape``); raising on a valid input stays an EXCEPTION.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import plan as gen
from mlafuzz.harness.ops.op import CallShape, Op, Outputs
from mlafuzz.reports.findings import Finding, Kind

FIELDS = ("request_start", "request_end", "starts", "seq_lens", "is_continuation")
CHECKS = ("covered_once_in_order", "continuation_first_only", "aligned_starts", "rows_in_budget", "well_formed")
INVARIANTS = (*CHECKS, "input_unchanged")
PLAN_OUTPUTS = frozenset({"chunks", "starts", "seq_lens"})
REPORT_KEY = "_plan_report"  # non-tensor outputs: invariant -> why it broke; the plan as read
PLAN_KEY = "_plan"


class PlanShapeError(RuntimeError):
    """The planner returned something that is not a list of chunks."""


def _ints(value: Any, what: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in (value.tolist() if hasattr(value, "tolist") else value))
    except (TypeError, ValueError):
        raise PlanShapeError(f"{what}={value!r} is not a sequence of ints") from None
    return out


def read_chunk(obj: Any, i: int) -> tuple[int, int, tuple[int, ...], tuple[int, ...], bool]:
    """One returned chunk as (request_start, request_end, starts, seq_lens, is_continuation)."""
    if isinstance(obj, Mapping):
        missing = [f for f in FIELDS if f not in obj]
        get = obj.__getitem__
    elif isinstance(obj, (tuple, list)) and not hasattr(obj, "_fields"):
        if len(obj) != len(FIELDS):
            raise PlanShapeError(f"chunk {i} is a {len(obj)}-tuple, expected {len(FIELDS)}: {', '.join(FIELDS)}")
        values = dict(zip(FIELDS, obj))
        missing, get = [], values.__getitem__
    else:  # an object (a dataclass, a named tuple)
        missing = [f for f in FIELDS if not hasattr(obj, f)]
        get = lambda f: getattr(obj, f)  # noqa: E731
    if missing:
        raise PlanShapeError(f"chunk {i} ({type(obj).__name__}) has no {', '.join(missing)}")
    try:
        rs, re_ = int(get("request_start")), int(get("request_end"))
    except (TypeError, ValueError):
        raise PlanShapeError(f"chunk {i}: request_start / request_end are not ints") from None
    cont = get("is_continuation")
    return rs, re_, _ints(get("starts"), f"chunk {i} starts"), _ints(get("seq_lens"), f"chunk {i} seq_lens"), bool(cont)


def _padded_rows(p: Mapping[str, Any]) -> Callable[[int], int]:
    from mlafuzz.oracles.plan import padded_rows_of

    return padded_rows_of(dcp_world_size=p["dcp_world_size"], interleave=p["interleave"])


def _tensors(chunks: list[tuple]) -> dict[str, torch.Tensor]:
    head = [[c[0], c[1], int(c[4])] for c in chunks]
    return {
        "chunks": torch.tensor(head, dtype=torch.int32).reshape(len(chunks), 3),
        "starts": torch.tensor([s for c in chunks for s in c[2]], dtype=torch.int32),
        "seq_lens": torch.tensor([n for c in chunks for n in c[3]], dtype=torch.int32),
    }


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    from mlafuzz.oracles.plan import Chunk, problems

    p = case.params
    lens = list(p["context_lens"])
    padded = _padded_rows(p)
    returned = fn(lens, p["row_budget"], p["max_context_chunk"], p["split_alignment"], padded)
    try:
        items = list(returned)
    except TypeError:
        raise PlanShapeError(f"plan returned {type(returned).__name__}, not a sequence of chunks") from None
    chunks = [read_chunk(c, i) for i, c in enumerate(items)]
    report = problems(
        [Chunk(*c) for c in chunks],
        context_lens=list(p["context_lens"]),
        row_budget=p["row_budget"],
        split_alignment=p["split_alignment"],
        padded_rows=padded,
    )
    report["input_unchanged"] = (
        None if lens == list(p["context_lens"]) else f"context_lens changed by the call: now {lens[:16]}"
    )
    out: dict[str, Any] = _tensors(chunks)
    out["invariants"] = torch.tensor([int(report[n] is None) for n in INVARIANTS], dtype=torch.int32)
    out[REPORT_KEY] = report
    out[PLAN_KEY] = chunks
    return out


def expected_plan(case: Case) -> list[tuple]:
    from mlafuzz.oracles.plan import plan_loop

    p = case.params
    return [
        (c.request_start, c.request_end, c.starts, c.seq_lens, c.is_continuation)
        for c in plan_loop(
            context_lens=list(p["context_lens"]),
            row_budget=p["row_budget"],
            max_context_chunk=p["max_context_chunk"],
            split_alignment=p["split_alignment"],
            padded_rows=_padded_rows(p),
        )
    ]


def oracle(case: Case) -> Outputs:
    out: dict[str, Any] = _tensors(expected_plan(case))
    out["invariants"] = torch.ones(len(INVARIANTS), dtype=torch.int32)
    return out


def _first_difference(got: list[tuple], want: list[tuple]) -> str:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            show = lambda c: dict(zip(FIELDS, (c[0], c[1], list(c[2]), list(c[3]), c[4])))  # noqa: E731
            return f"chunk {i} is {show(a)}, the rule (docs/contract.md, plan) gives {show(b)}"
    return f"{len(got)} chunks, the rule (docs/contract.md, plan) gives {len(want)}"


def review_plan(case: Case, call: Any, findings: list[Finding], ctx: Any) -> list[Finding]:
    """The plan op's ``review`` (module docstring)."""
    outputs = call.outputs or {}
    report = outputs.get(REPORT_KEY) or {}
    broken: list[Finding] = []
    plan: list[Finding] = []
    out: list[Finding] = []
    for f in findings:
        if f.kind is Kind.EXCEPTION and isinstance(call.error, PlanShapeError):
            out.append(dataclasses.replace(f, kind=Kind.METADATA_MISMATCH, cause="plan:shape", message=str(call.error)))
        elif f.tensor == "invariants" and f.kind is Kind.VALUE_MISMATCH:
            why = [(n, w) for n, w in report.items() if w is not None] or [("invariants", f.message)]
            broken += [
                dataclasses.replace(
                    f,
                    kind=Kind.METADATA_MISMATCH,
                    cause=f"plan:{n}",
                    mismatches=(),
                    message=f"plan invariant {n} broken (docs/contract.md, plan): {w}",
                )
                for n, w in why
            ]
        elif f.tensor in PLAN_OUTPUTS:
            plan.append(f)
        else:
            out.append(f)
    if not plan:
        return broken + out
    also = f"; {', '.join(sorted({str(g.tensor) for g in plan}))} differ"
    if broken:
        head = broken[0]
        return [dataclasses.replace(head, message=head.message + also), *broken[1:], *out]
    first = plan[0]
    diff = _first_difference(outputs.get(PLAN_KEY) or [], expected_plan(case))
    return [
        dataclasses.replace(
            first, kind=Kind.METADATA_MISMATCH, cause="plan:rule", message=f"plan differs from the rule: {diff}{also}"
        ),
        *out,
    ]


PLAN = Op(
    name="plan",
    share=46,  # H200 steady cases/s, docs/performance.md: 9,107; a share is ~200/s
    generator=gen.GENERATOR,
    oracle=oracle,
    oracle_slow=oracle,
    invoke=invoke,
    defaults={"cpu": ("ours",), "cuda": ("ours",)},
    contract=frozenset(),
    review=review_plan,
    call=CallShape(positional=("context_lens", "row_budget", "max_context_chunk", "split_alignment", "padded_rows")),
    ours="ours",
    # SPEC 9.1 (vLLM #50613): pure Python, so it runs on the CPU too.
    vllm=(("vllm.model_executor.layers.attention.mla_attention", "plan_mla_context_chunks"),),
    vllm_devices=frozenset({"cpu", "cuda"}),
)
