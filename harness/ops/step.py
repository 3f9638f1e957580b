"""The ``step`` op's row of the op table: one scheduler step through a step pipeline, checked
against oracles.step (SPEC.md sections 1 and 5).

Sub-implementations. A step implementation is called as
``fn(kv_cache=..., block_table=..., query_start_loc=..., seq_lens=...,
req_id_per_token=..., topk_indices=..., num_tokens=..., threshold=...,
require_uniform=..., workspace_rows=..., topk=..., block_n=..., convert=...,
gather=..., plan=...)`` and returns a dict of named tensors. The harness hands it the
``convert`` (SPEC 3), ``gather`` (SPEC 4) and ``plan`` (SPEC 9.1: the packing chunk planner,
loaded when first called, which a revision whose ``context_chunks`` rule is
``packing_planner`` does) to call (the ``sub`` source of
``invoke``: any ``--impl`` reference, from ``$MLAFUZZ_STEP_CONVERT`` /
``$MLAFUZZ_STEP_GATHER`` / ``$MLAFUZZ_STEP_PLAN``, else those ops' defaults in the op table; the
session resolves them once per process). Environment variables reach
spawned workers unchanged and need no spec field (the spec says what the
step is, not who runs it); findings name the pair in ``extra``.

Recording (harness/ops/step_calls.py). Both callables are wrapped: each call is recorded, and
the preconditions the pipeline owes its sub-ops are checked before the call goes
through (so a buggy pipeline cannot make a kernel write out of bounds):
convert's ``req_id`` rows == ``token_indices`` rows (the PR #48642 bug), and
gather's SPEC 4 preconditions. A violation raises ``StepCallError``.

Findings. Outputs are compared by name; ``invariants`` (int32 flags, the
oracle's all ones) carries the cross-field checks of ``INVARIANTS``: the
rows passed to convert and the gather calls made against the pipeline's own
metadata outputs. ``review_step`` (the row's ``review``, run on the first
call's findings) re-files what the comparator says, one cause one finding:

- the metadata outputs that differ from the oracle's are one
  METADATA_MISMATCH, named after the first of them in the order the pipeline
  builds them (``METADATA_ORDER``: a wrong split makes every count after it
  differ too), the others listed in its message;
- each broken invariant is a METADATA_MISMATCH (cause ``step:<name>``), and a
  ``StepCallError`` one named after the broken precondition;
- the data outputs (``DATA_OUTPUTS``: what the sub-op calls made) cannot match
  when the plan of those calls is wrong: their mismatches are folded into the
  finding that says so (the metadata one, else the broken invariant about
  their calls), which counts them in its message. With the plan right, a data
  mismatch stays a finding of its own (a sub-implementation's bug).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops import step as gen
from mlafuzz.harness.ops.op import CallShape, Op, Outputs
from mlafuzz.harness.ops.step_calls import INVARIANTS, StepCallError, run_step
from mlafuzz.oracles import revisions
from mlafuzz.reports.findings import Finding, Kind

SUB_REFS_KEY = "_step_sub_impls"  # non-tensor output: the sub-implementations' --impl references

METADATA_OUTPUTS = frozenset(
    {
        "num_decodes",
        "num_prefills",
        "num_decode_tokens",
        "num_prefill_tokens",
        "decode_query_len",
        "num_active_decodes",
        "dense_route",
        "prefill_request_ids",
        "prefill_chunks",
        "workspace_starts",
        "prefill_chunk_seq_tot",
        "context_chunk",
        "context_starts",
        "context_lens",
        "context_cu_seq_lens",
        "context_seq_tot",
        "context_requests",
        "invariants",
    }
)
# The order the pipeline builds its metadata in (SPEC 5.1, 5.3, 5.4, 5.2): one that differs makes
# those after it differ too.
METADATA_ORDER = (
    "num_decodes",
    "num_prefills",
    "num_decode_tokens",
    "num_prefill_tokens",
    "decode_query_len",
    "num_active_decodes",
    "prefill_request_ids",
    "prefill_chunks",
    "workspace_starts",
    "prefill_chunk_seq_tot",
    "dense_route",
    "context_chunk",
    "context_requests",
    "context_starts",
    "context_lens",
    "context_cu_seq_lens",
    "context_seq_tot",
)
# What the sub-op calls made, and the invariants about the calls that made it.
DATA_OUTPUTS: dict[str, tuple[str, ...]] = {
    "decode_slots": ("convert_decode_rows",),
    "prefill_slots": ("convert_prefill_rows",),
    "context_rows": ("gather_calls", "gathered_rows"),
    "prefill_seq_rows": ("gather_calls", "gathered_rows"),
}
_COMPARED = (Kind.VALUE_MISMATCH, Kind.NAN_MISMATCH, Kind.SUBNORMAL_FLUSH)  # the comparator's kinds
REPORT_KEY = "_step_report"  # non-tensor output: invariant name -> why it broke (None: holds)


# --- the op -------------------------------------------------------------------


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable]) -> Outputs:
    out, rec = run_step(fn, case, t, sub)
    report = rec.report(out)
    out["invariants"] = torch.tensor([int(report[n] is None) for n in INVARIANTS], dtype=torch.int32)
    out[REPORT_KEY] = report
    out[SUB_REFS_KEY] = dict(getattr(sub, "refs", {}))
    return out


def _oracle(loop: bool) -> Callable[[Case], Outputs]:
    def run(case: Case) -> Outputs:
        from mlafuzz.oracles.step import step_oracle

        t, p = case.tensors, case.params
        revision = revisions.get(p.get("revision") or revisions.newest())
        out = step_oracle(
            kv_cache=t["kv_cache"],
            block_table=t["block_table"],
            query_start_loc=t["query_start_loc"],
            seq_lens=t["seq_lens"],
            req_id_per_token=t["req_id_per_token"],
            topk_indices=t["topk_indices"],
            num_tokens=p["num_tokens"],
            threshold=p["threshold"],
            require_uniform=p["require_uniform"],
            workspace_rows=p["workspace_rows"],
            topk=p["topk"],
            context_chunks=revision.rule("context_chunks"),
            dcp_world_size=p.get("dcp_world_size", 1),
            dcp_interleave=p.get("dcp_interleave", 1),
            loop=loop,
        )
        out["invariants"] = torch.ones(len(INVARIANTS), dtype=torch.int32)
        return out

    return run


def review_step(case: Case, call: Any, findings: list[Finding], ctx: Any) -> list[Finding]:
    """The step op's ``review`` (see the module docstring): metadata and call-contract problems
    become METADATA_MISMATCH, one per cause, with the data mismatches they explain folded in."""
    refs = (call.outputs or {}).get(SUB_REFS_KEY) if call.outputs else None
    extra = {"step_sub_impls": refs} if refs else {}
    metadata: list[Finding] = []
    broken: dict[str, Finding] = {}  # invariant -> its finding
    data: list[Finding] = []
    out: list[Finding] = []
    for f in findings:
        f = dataclasses.replace(f, extra={**f.extra, **extra})
        if f.kind is Kind.EXCEPTION and isinstance(call.error, StepCallError):
            out.append(
                dataclasses.replace(
                    f, kind=Kind.METADATA_MISMATCH, cause=f"step:{call.error.cause}", message=str(call.error)
                )
            )
        elif f.tensor == "invariants" and f.kind is Kind.VALUE_MISMATCH and call.outputs:
            report = call.outputs.get(REPORT_KEY) or {}
            why = [(n, w) for n, w in report.items() if w is not None] or [("invariants", f.message)]
            for n, w in why:
                broken[n] = dataclasses.replace(
                    f,
                    kind=Kind.METADATA_MISMATCH,
                    cause=f"step:{n}",
                    mismatches=(),
                    message=f"cross-field invariant {n} broken: {w}",
                )
        elif f.tensor in METADATA_OUTPUTS and f.kind is Kind.VALUE_MISMATCH:
            metadata.append(f)
        elif f.tensor in DATA_OUTPUTS and f.kind in _COMPARED:
            data.append(f)
        else:
            out.append(f)
    first = _one_metadata_finding(metadata)
    explained: dict[str, list[Finding]] = {}
    for f in data:
        by = "metadata" if first is not None else next((n for n in DATA_OUTPUTS[f.tensor] if n in broken), None)
        if by is None:
            out.append(f)  # the plan is right: the data is a sub-implementation's own problem
        else:
            explained.setdefault(by, []).append(f)
    head = [] if first is None else [_folding(first, explained.get("metadata", []))]
    return head + [_folding(f, explained.get(n, [])) for n, f in broken.items()] + out


def _one_metadata_finding(metadata: list[Finding]) -> Finding | None:
    """A case's metadata mismatches as one finding, named after the first in METADATA_ORDER."""
    if not metadata:
        return None
    rank = {name: i for i, name in enumerate(METADATA_ORDER)}
    ordered = sorted(metadata, key=lambda f: rank.get(f.tensor or "", len(rank)))
    head, rest = ordered[0], [f.tensor for f in ordered[1:]]
    after = f"; {len(rest)} more metadata outputs differ after it: {', '.join(str(t) for t in rest)}" if rest else ""
    return dataclasses.replace(
        head,
        kind=Kind.METADATA_MISMATCH,
        message=f"metadata {head.message}{after}",
        extra={**head.extra, **({"also_differ": rest} if rest else {})},
    )


def _folding(f: Finding, folded: list[Finding]) -> Finding:
    """``f``, also accounting for the data mismatches ``folded`` (what the calls it is about made)."""
    if not folded:
        return f
    parts = [
        f"{g.tensor} {'shape' if g.cause.endswith(':shape') else f'{g.count} / {g.total} elements'} ({g.kind.value})"
        for g in folded
    ]
    return dataclasses.replace(
        f,
        message=f"{f.message}; what the sub-op calls made differs as a consequence: {', '.join(parts)}",
        extra={
            **f.extra,
            "folded": [
                {"tensor": g.tensor, "kind": g.kind.value, "cause": g.cause, "count": g.count, "total": g.total}
                for g in folded
            ],
        },
    )


STEP = Op(
    name="step",
    share=7,  # H200 steady cases/s, docs/performance.md: 1,386; a share is ~200/s
    generator=gen.GENERATOR,
    oracle=_oracle(False),
    oracle_slow=_oracle(True),
    invoke=invoke,
    defaults={"cpu": ("ours",), "cuda": ("ours",)},
    contract=frozenset(),
    review=review_step,
    fast="step",  # harness/fast/step.py
    call=CallShape(
        keywords=(
            "kv_cache",
            "block_table",
            "query_start_loc",
            "seq_lens",
            "req_id_per_token",
            "topk_indices",
            "num_tokens",
            "threshold",
            "require_uniform",
            "workspace_rows",
            "topk",
            "block_n",
            "convert",
            "gather",
            "plan",
            "dcp_world_size",
            "dcp_interleave",
            "dcp_kv_cache",
            "dcp_block_table",
        )
    ),
)
