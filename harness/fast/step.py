"""The fast path's check of step (the op row's ``fast``): a whole step judged with the fused checks
of its sub-ops and one comparison of every int, no host sync of its own.

What the full path reads back, this check knows on the host before the call: the step's metadata
is a function of query_start_loc and seq_lens, which the case's spec holds (oracles/step.py
``step_metadata``: the oracle's own code, on host ints). From it come the oracle's metadata
outputs and the gather calls that metadata plans (harness/ops/step.py ``planned_gathers``), both
sent to the device in one copy. Then:

- every metadata output and every gather call's ``workspace_starts`` / ``seq_starts`` (and block
  table rows, when the call did not pass the very rows of the case's table) are compared with the
  oracle's in one concatenation and one comparison;
- ``decode_slots`` / ``prefill_slots`` go through convert's fused check (convert_rows.py) on the
  case's own inputs, as the oracle converts them; ``context_rows`` / ``prefill_seq_rows`` through
  gather's (gather.py) as the oracle dequantizes them: one launch each, both runs in it;
- the cross-field invariants (harness/ops/step.py) are read on the host from the call shapes and
  the oracle's metadata, which the comparison holds the pipeline's to.

A gather call. The full path copies each call's arguments to the host and checks SPEC 4's
preconditions before the kernel runs (a buggy pipeline must not make it write out of bounds). Here
the host checks what it can without reading the device (the batch size, dst's rows, the cache and
the table being the case's), and the kernel is then called with the plan's own arguments, which
hold the preconditions by construction; the pipeline's are compared with them on the device. A
case is Clear only when they are equal, so a Clear case's calls were exactly the pipeline's. A call
the host cannot match to the plan is made as the full path makes it (read back, preconditions
checked) and the case is left to the full path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.rng.fill import upload
from mlafuzz.harness.fast.convert_rows import convert_rows_flag
from mlafuzz.harness.fast.gather import ROW_DIM, gather_rows_flag
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.memory.bits import host_copies
from mlafuzz.harness.ops.op import Outputs
from mlafuzz.harness.ops.step_calls import PlannedGather, SubCallRecorder, planned_gathers, run_step, runs_dcp
from mlafuzz.oracles import revisions
from mlafuzz.oracles.step import StepMetadata, step_metadata

__all__ = ["RERUNS", "check", "invoke", "takes"]

_PLAN, _RECORDERS = "step:plan", "step:recorders"

# The check judges a re-run's outputs itself (in the same launches as the first run's).
RERUNS = True


@dataclass(frozen=True)
class _Plan:
    """What the oracle's metadata says of a case, on the host and (``want``) on the device."""

    meta: StepMetadata
    gathers: list[PlannedGather]
    want: torch.Tensor  # the metadata outputs' values, flattened one after another
    ws: list[torch.Tensor]  # per planned gather, its workspace_starts / seq_starts on the device
    ss: list[torch.Tensor]
    prefill_ids: torch.Tensor  # the sparse route's convert: prefill_request_ids[ndt:], workspace_starts
    prefill_starts: torch.Tensor
    rows_ws: torch.Tensor  # where each prefill-side request's rows start in its data output


def _host_lists(case: Case, t: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """query_start_loc and seq_lens as host ints: from the spec (what the tensors were made from),
    or read back in one sync for a case made another way."""
    spec = case.spec
    qsl, reqs = getattr(spec, "query_start_loc", None), getattr(spec, "requests", None)
    if qsl is not None and reqs is not None:
        return list(qsl), [int(r.seq_len) for r in reqs]
    q, s = host_copies(t["query_start_loc"], t["seq_lens"])
    return q.reshape(-1).tolist(), s.reshape(-1).tolist()


def _plan(case: Case, t: Mapping[str, Any], state: CaseState) -> _Plan:
    """The case's plan, made once (before its first call) and kept for its re-run and check."""
    if _PLAN in state.memo:
        return state.memo[_PLAN]
    p = case.params
    qsl, sl = _host_lists(case, t)
    world, inter = p.get("dcp_world_size", 1), p.get("dcp_interleave", 1)
    meta = step_metadata(
        query_start_loc=qsl,
        seq_lens=sl,
        block_size=p["block_size"],
        num_tokens=p["num_tokens"],
        threshold=p["threshold"],
        require_uniform=p["require_uniform"],
        workspace_rows=p["workspace_rows"],
        topk=p["topk"],
        context_chunks=revisions.get(p.get("revision") or revisions.newest()).rule("context_chunks"),
        dcp_world_size=world,
        dcp_interleave=inter,
    )
    gathers = planned_gathers(meta.outputs, dcp=(world, inter) if runs_dcp(case) else None, n_req=len(sl))
    lengths = meta.context_lens if meta.dense else [sl[r] for r in meta.prefills]
    ndt = meta.num_decode_tokens
    parts = upload(
        [v for m in meta.outputs.values() for v in m.reshape(-1).tolist()],
        *(x for g in gathers for x in (g.ws, g.seq_starts)),
        meta.prefill_request_ids[ndt:],
        meta.workspace_starts,
        [sum(lengths[:i]) for i in range(len(lengths))],
        device=t["topk_indices"].device,
    )
    want, *calls = parts[: 1 + 2 * len(gathers)]
    ids, starts, rows_ws = parts[1 + 2 * len(gathers) :]
    plan = _Plan(
        meta=meta,
        gathers=gathers,
        want=want,
        ws=calls[0::2],
        ss=calls[1::2],
        prefill_ids=ids,
        prefill_starts=starts,
        rows_ws=rows_ws,
    )
    state.memo[_PLAN] = plan
    return plan


def _same(a: Any, b: torch.Tensor) -> bool:
    """Whether ``a`` is the tensor ``b`` as the kernel reads it: same memory, shape and strides, and
    elements of one size (an fp8 view of a uint8 cache is the same bytes)."""
    return (
        isinstance(a, torch.Tensor)
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and (a.dtype == b.dtype or a.element_size() == b.element_size() == 1)
    )


def _ints(x: Any, n: int, device: torch.device) -> bool:
    """An int32 tensor of at least ``n`` elements on ``device`` (as a gather takes its starts)."""
    return isinstance(x, torch.Tensor) and x.dtype == torch.int32 and x.numel() >= n and x.device == device


@dataclass
class _Recorder(SubCallRecorder):
    """The step's recorder (harness/ops/step.py) with its gather calls matched to the plan instead
    of read back (the module docstring)."""

    plan: _Plan | None = None
    tensors: Mapping[str, Any] = field(default_factory=dict)
    made: int = 0  # gather calls made
    undecided: bool = False  # a call was made the full path's way: the full path judges the case
    got: list[torch.Tensor] = field(default_factory=list)  # the calls' arguments, and the plan's
    want: list[torch.Tensor] = field(default_factory=list)

    def gather(self, src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
        assert self.plan is not None
        i, b = self.made, int(batch_size)
        self.made += 1
        g = self.plan.gathers[i] if i < len(self.plan.gathers) else None
        cache = self.tensors.get(g.cache) if g is not None else None
        table = self.tensors.get(g.table) if g is not None else None
        planned = (
            g is not None
            and isinstance(cache, torch.Tensor)
            and isinstance(table, torch.Tensor)
            and b == g.batch_size
            and _same(src_cache, cache)
            and isinstance(dst, torch.Tensor)
            and tuple(dst.shape) == (g.total, ROW_DIM)
            and _ints(workspace_starts, b, cache.device)
            and (_ints(seq_starts, b, cache.device) if seq_starts is not None else not any(g.seq_starts))
            and _ints(block_table, 0, cache.device)
            and block_table.dim() == 2
            and block_table.shape[0] >= b
            and block_table.shape[1] == table.shape[1]
        )
        if not planned:
            self.undecided = True
            return super().gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
        assert g is not None and isinstance(table, torch.Tensor)
        rows = table[g.first : g.first + b]
        self.got.append(workspace_starts.reshape(-1)[:b])
        self.want.append(self.plan.ws[i])
        if seq_starts is not None:
            self.got.append(seq_starts.reshape(-1)[:b])
            self.want.append(self.plan.ss[i])
        if not _same(block_table[:b], rows):
            self.got.append(block_table[:b].reshape(-1))
            self.want.append(rows.reshape(-1))
        ss = self.plan.ss[i] if seq_starts is not None else None
        return self.gather_fn(src_cache, dst, rows, self.plan.ws[i], b, ss)

    def _on_host(self, out: Mapping[str, Any]) -> dict[str, Any]:
        return dict(out)  # ``report`` is given the oracle's metadata, on the host already

    def _gather_calls(self, out: Mapping[str, Any]) -> str | None:
        n = len(self.plan.gathers) if self.plan is not None else -1
        return None if self.made == n else f"{self.made} gather calls for {n} planned"


def invoke(fn: Callable, case: Case, t: Mapping[str, Any], sub: Callable[[str], Callable], *, state: CaseState):
    """The op row's ``invoke`` (harness/ops/step.py) with the recorder above; the recorder is kept
    for the check."""
    plan = _plan(case, t, state)
    out, rec = run_step(fn, case, t, sub, recorder=functools.partial(_Recorder, plan=plan, tensors=t))
    state.memo.setdefault(_RECORDERS, []).append(rec)
    return out


def takes(case: Case) -> bool:
    return True


def _shapes(case: Case, plan: _Plan) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every output the oracle makes: its shape and dtype."""
    meta, p = plan.meta, case.params
    k, n, ndt = p["topk"], case.tensors["topk_indices"].shape[0], meta.num_decode_tokens
    ctx = sum(meta.context_lens) if meta.dense else 0
    seq = 0 if meta.dense else sum(meta.seq_lens[r] for r in meta.prefills)
    return {
        **{name: (tuple(v.shape), torch.int32) for name, v in meta.outputs.items()},
        "decode_slots": ((ndt, k), torch.int32),
        "prefill_slots": ((0 if meta.dense else n - ndt, k), torch.int32),
        "context_rows": ((ctx, ROW_DIM), torch.bfloat16),
        "prefill_seq_rows": ((seq, ROW_DIM), torch.bfloat16),
    }


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    """Each run's outputs against the oracle's (the module docstring): ``flag[0]`` set where any
    differs, no sync. False: it cannot tell from the host (an output of another shape, dtype or
    device, a broken invariant, a call made the full path's way)."""
    plan, recs = state.memo.get(_PLAN), state.memo.get(_RECORDERS, [])
    runs = [outputs] + ([second] if second is not None else [])
    if plan is None or len(recs) != len(runs) or any(r.undecided for r in recs):
        return False
    dev = flag.device
    shapes = _shapes(case, plan)
    for o in runs:
        for name, (shape, dtype) in shapes.items():
            v = o.get(name)
            if not (isinstance(v, torch.Tensor) and tuple(v.shape) == shape and v.dtype == dtype and v.device == dev):
                return False
    for o, rec in zip(runs, recs):
        if any(why is not None for why in rec.report({**o, **plan.meta.outputs}).values()):
            return False
    got = [o[name].reshape(-1) for o in runs for name in plan.meta.outputs] + [x for r in recs for x in r.got]
    want = [plan.want] * len(runs) + [x for r in recs for x in r.want]
    n = sum(x.numel() for x in got)
    both = torch.cat(got + want)
    flag[0:1].copy_(both[:n].ne(both[n:]).any().reshape(1))
    return _slots(case, plan, runs, flag, state) and _rows(case, plan, runs, flag, state)


def _slots(case: Case, plan: _Plan, runs: list[Outputs], flag: torch.Tensor, state: CaseState) -> bool:
    """decode_slots and (sparse route) prefill_slots through convert's fused check."""
    t, ndt = case.tensors, plan.meta.num_decode_tokens
    common = dict(block_table=t["block_table"], block_size=case.params["block_size"])
    checks = [
        ("decode_slots", slice(0, ndt), dict(has_prefill_workspace=False)),
        (
            "prefill_slots",
            slice(ndt, None),
            dict(
                has_prefill_workspace=True,
                prefill_workspace_request_ids=plan.prefill_ids,
                prefill_workspace_starts=plan.prefill_starts,
            ),
        ),
    ]
    for name, rows, kw in checks:
        if name == "prefill_slots" and plan.meta.dense:
            continue  # [0, K], held by the shapes
        kw.setdefault("prefill_workspace_request_ids", None)
        kw.setdefault("prefill_workspace_starts", None)
        done = convert_rows_flag(
            out=runs[0][name],
            valid_counts=None,
            second=(runs[1][name], None) if len(runs) > 1 else None,
            flag=flag,
            launchers=state.launchers,
            req_id=t["req_id_per_token"][rows],
            token_indices=t["topk_indices"][rows],
            **common,
            **kw,
        )
        if done is None:
            return False
    return True


def _rows(case: Case, plan: _Plan, runs: list[Outputs], flag: torch.Tensor, state: CaseState) -> bool:
    """The route's data output (every context token, or every prefill sequence, request after
    request) through gather's fused check, from the case's cache and table."""
    meta, t = plan.meta, case.tensors
    name = "context_rows" if meta.dense else "prefill_seq_rows"
    dst = runs[0][name]
    if dst.shape[0] == 0:
        return True  # nothing to compare (the shapes hold the empty output)
    done = gather_rows_flag(
        src_cache=t["kv_cache"],
        dst=dst,
        dst2=runs[1][name] if len(runs) > 1 else None,
        block_table=t["block_table"][meta.num_decodes :],
        workspace_starts=plan.rows_ws,
        batch_size=len(meta.prefills),
        seq_starts=None,
        flag=flag,
        launchers=state.launchers,
    )
    return done is not None
