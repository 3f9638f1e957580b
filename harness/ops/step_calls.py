"""Recording a step pipeline's sub-op calls (the ``step`` op, harness/ops/step.py): what the pipeline
passed its ``convert`` and ``gather``, the preconditions it owes them, checked before each call goes
through (so a buggy pipeline cannot make a kernel write out of bounds), and the cross-field
invariants between its own outputs and those calls (``INVARIANTS``); the gather calls a step's
metadata plans (``planned_gathers``), which the invariants and the GPU fast path read.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.memory.bits import host_copies
from mlafuzz.oracles import revisions

# Cross-field invariants between the pipeline's own outputs and the calls it made (1 = holds).
INVARIANTS = ("convert_decode_rows", "convert_prefill_rows", "gather_calls", "gathered_rows")

# The outputs the invariants read by value (the rest by shape only).
_READ_BY_VALUE = (
    "num_decodes",
    "num_decode_tokens",
    "num_prefill_tokens",
    "dense_route",
    "context_starts",
    "context_lens",
    "context_cu_seq_lens",
    "context_requests",
    "context_seq_tot",
    "workspace_starts",
    "prefill_chunks",
    "prefill_chunk_seq_tot",
)


class StepCallError(RuntimeError):
    """The pipeline called a sub-op with arguments that break what SPEC says it must pass."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


# --- recording the pipeline's sub-calls --------------------------------------


@dataclass(frozen=True)
class ConvertCall:
    rows: int
    workspace: bool


@dataclass(frozen=True)
class GatherCall:
    total: int
    batch_size: int
    ws: tuple[int, ...]
    seq_starts: tuple[int, ...] | None
    table: tuple[tuple[int, ...], ...] = ()  # the block table rows it read (its first batch_size rows)


@dataclass
class SubCallRecorder:
    convert_fn: Callable
    gather_fn: Callable
    block_table: Any = None  # the step's whole block table: a chunk's gather reads a row slice of it
    # (D, I, every rank's block table [D * R, M]) when the context gather runs under DCP (SPEC 9.1)
    dcp: tuple[int, int, Any] | None = None
    converts: list[ConvertCall] = field(default_factory=list)
    gathers: list[GatherCall] = field(default_factory=list)

    def convert(
        self,
        req_id,
        block_table,
        token_indices,
        BLOCK_SIZE=64,
        NUM_TOPK_TOKENS=2048,
        BLOCK_N=128,
        HAS_PREFILL_WORKSPACE=False,
        prefill_workspace_request_ids=None,
        prefill_workspace_starts=None,
        return_valid_counts=False,
    ):
        n_req, n_idx = int(req_id.shape[0]), int(token_indices.shape[0])
        if n_req != n_idx:
            raise StepCallError(
                "convert:req_id_rows",
                f"step called convert with req_id rows={n_req} != token_indices rows={n_idx}"
                " (docs/contract.md, step: req_id_per_token[:num_decode_tokens] goes with"
                " topk_indices[:num_decode_tokens])",
            )
        self.converts.append(ConvertCall(rows=n_idx, workspace=bool(HAS_PREFILL_WORKSPACE)))
        return self.convert_fn(
            req_id,
            block_table,
            token_indices,
            BLOCK_SIZE=BLOCK_SIZE,
            NUM_TOPK_TOKENS=NUM_TOPK_TOKENS,
            BLOCK_N=BLOCK_N,
            HAS_PREFILL_WORKSPACE=HAS_PREFILL_WORKSPACE,
            prefill_workspace_request_ids=prefill_workspace_request_ids,
            prefill_workspace_starts=prefill_workspace_starts,
            return_valid_counts=return_valid_counts,
        )

    def gather(self, src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
        from mlafuzz.oracles.gather import gather_preconditions

        b = int(batch_size)
        # The call's metadata crosses to the host once (a sync per read stops a run scaling with
        # workers: issue 29); the checks below read the same values from there.
        host_ws, host_ss, host_table = host_copies(workspace_starts, seq_starts, block_table)
        ws = tuple(host_ws.reshape(-1)[:b].tolist())
        ss = None if host_ss is None else tuple(host_ss.reshape(-1)[:b].tolist())
        where = (
            f"(batch_size={b}, dst rows={dst.shape[0]}, workspace_starts={list(ws)}, seq_starts="
            f"{None if ss is None else list(ss)})"
        )
        try:
            bad = gather_preconditions(
                src_cache=src_cache,
                block_table=host_table,
                workspace_starts=host_ws,
                batch_size=b,
                seq_starts=host_ss,
                total=int(dst.shape[0]),
            )
        except (TypeError, ValueError) as exc:
            raise StepCallError(
                "gather:malformed", f"step called gather with malformed arguments {where}: {exc}"
            ) from None
        if bad:
            raise StepCallError(f"gather:{bad[0]}", f"step called gather breaking its preconditions {bad} {where}")
        rows = tuple(tuple(r) for r in host_table[:b].tolist())
        self.gathers.append(GatherCall(total=int(dst.shape[0]), batch_size=b, ws=ws, seq_starts=ss, table=rows))
        return self.gather_fn(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)

    # -- cross-field invariants, from the pipeline's own outputs -------------

    def report(self, out: Mapping[str, Any]) -> dict[str, str | None]:
        checks = {
            "convert_decode_rows": self._convert_rows_decode,
            "convert_prefill_rows": self._convert_rows_prefill,
            "gather_calls": self._gather_calls,
            "gathered_rows": self._gathered_rows,
        }
        out = self._on_host(out)
        result: dict[str, str | None] = {}
        for name in INVARIANTS:
            try:
                result[name] = checks[name](out)
            except (KeyError, TypeError, ValueError, IndexError, RuntimeError):
                result[name] = None  # an output is missing or malformed: the comparator reports that one
        return result

    def _on_host(self, out: Mapping[str, Any]) -> dict[str, Any]:
        """``out`` with the metadata the checks read by value, and the tables they slice, copied to
        the host in one sync (issue 29); data outputs, read by shape only, stay where they are."""
        names = [n for n in _READ_BY_VALUE if isinstance(out.get(n), torch.Tensor)]
        world, inter, dcp_table = self.dcp if self.dcp is not None else (None, None, None)
        *values, self.block_table, dcp_table = host_copies(*(out[n] for n in names), self.block_table, dcp_table)
        if self.dcp is not None:
            self.dcp = (world, inter, dcp_table)
        return {**out, **dict(zip(names, values))}

    @staticmethod
    def _int(out: Mapping[str, Any], name: str) -> int:
        return int(out[name].reshape(()).item())

    def _convert_rows_decode(self, out: Mapping[str, Any]) -> str | None:
        rows = sum(c.rows for c in self.converts if not c.workspace)
        ndt, slots = self._int(out, "num_decode_tokens"), int(out["decode_slots"].shape[0])
        if rows == ndt == slots:
            return None
        return f"convert got {rows} decode rows, decode_slots has {slots}, num_decode_tokens={ndt}"

    def _convert_rows_prefill(self, out: Mapping[str, Any]) -> str | None:
        rows = sum(c.rows for c in self.converts if c.workspace)
        want = 0 if self._int(out, "dense_route") else self._int(out, "num_prefill_tokens")
        slots = int(out["prefill_slots"].shape[0])
        if rows == want == slots:
            return None
        return f"convert got {rows} prefill rows, prefill_slots has {slots}, expected {want} for this route"

    def _expected_gathers(self, out: Mapping[str, Any]) -> list[GatherCall]:
        """The gather calls the pipeline's own metadata says it makes (``planned_gathers``), with
        the table rows each reads."""
        world, _, dcp_table = self.dcp if self.dcp is not None else (1, 1, None)
        tables = {"block_table": self.block_table, "dcp_block_table": dcp_table}
        n_req = int(dcp_table.shape[0]) // world if dcp_table is not None else 0
        return [
            GatherCall(
                total=g.total,
                batch_size=g.batch_size,
                ws=g.ws,
                seq_starts=g.seq_starts,
                table=tuple(tuple(r) for r in tables[g.table][g.first : g.first + g.batch_size].tolist()),
            )
            for g in planned_gathers(out, dcp=self.dcp[:2] if self.dcp is not None else None, n_req=n_req)
        ]

    def _gather_calls(self, out: Mapping[str, Any]) -> str | None:
        want = self._expected_gathers(out)
        got = [dataclasses.replace(g, seq_starts=g.seq_starts or (0,) * g.batch_size) for g in self.gathers]
        if got == want:
            return None
        if len(got) != len(want):
            return f"{len(got)} gather calls for {len(want)} chunks of the pipeline's own plan"
        i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        fields = [f.name for f in dataclasses.fields(GatherCall) if getattr(got[i], f.name) != getattr(want[i], f.name)]
        show = lambda g: {f: getattr(g, f) for f in fields if f != "table"}  # noqa: E731
        rows = " (block_table: not the chunk's rows of the prefill table)" if "table" in fields else ""
        return f"gather call {i} got {show(got[i])}, but the pipeline's own metadata says {show(want[i])}{rows}"

    def _gathered_rows(self, out: Mapping[str, Any]) -> str | None:
        dense = self._int(out, "dense_route")
        ctx = int(out["context_lens"].sum()) if dense else 0
        seq = 0 if dense else int(out["prefill_chunk_seq_tot"].sum())
        got_ctx, got_seq = int(out["context_rows"].shape[0]), int(out["prefill_seq_rows"].shape[0])
        if (got_ctx, got_seq) == (ctx, seq):
            return None
        return f"context_rows has {got_ctx} rows for {ctx} context tokens, prefill_seq_rows {got_seq} for {seq}"


@dataclass(frozen=True)
class PlannedGather:
    """A gather call that a step's metadata says the pipeline makes: it reads records from the
    input ``cache`` through rows [first, first + batch_size) of the input ``table``."""

    total: int
    batch_size: int
    ws: tuple[int, ...]
    seq_starts: tuple[int, ...]
    cache: str
    table: str
    first: int


def planned_gathers(out: Mapping[str, Any], *, dcp: tuple[int, int] | None, n_req: int) -> list[PlannedGather]:
    """The gather calls the metadata ``out`` (host tensors, by output name) plans: per context chunk,
    over its requests [rs, re) (every prefill for an equal-width chunk), the prefill table's rows
    from rs, its cu_seq_lens from rs and its starts (SPEC 5.2 / 9.1); per 5.3 chunk, whole
    sequences from 0. Under DCP (``dcp`` = (D, I), the planner's context chunks), per chunk, D
    gathers (rank after rank): request r's slice [s, s+n) as local rows from padded(s),
    padded(s+n) - padded(s) of them, padded(x) = ceil(x / (D*I)) * I, from rank k's rows of its
    block table (``n_req`` rows a rank)."""
    nd = int(out["num_decodes"])
    if int(out["dense_route"]) and dcp is not None:
        world, inter = dcp
        padded = lambda x: -(-x // (world * inter)) * inter  # noqa: E731
        calls = []
        starts, lens = out["context_starts"].tolist(), out["context_lens"].tolist()
        for i, (rs, re_) in enumerate(out["context_requests"].tolist()):
            local = [padded(s) for s in starts[i][rs:re_]]
            sizes = [padded(s + n) - ls for s, n, ls in zip(starts[i][rs:re_], lens[i][rs:re_], local)]
            cu = tuple(itertools.accumulate([0] + sizes))
            calls += [
                PlannedGather(
                    total=cu[-1],
                    batch_size=re_ - rs,
                    ws=cu[:-1],
                    seq_starts=tuple(local),
                    cache="dcp_kv_cache",
                    table="dcp_block_table",
                    first=k * n_req + nd + rs,
                )
                for k in range(world)
            ]
        return calls
    if int(out["dense_route"]):
        starts, cu = out["context_starts"].tolist(), out["context_cu_seq_lens"].tolist()
        return [
            PlannedGather(
                total=t,
                batch_size=re_ - rs,
                ws=tuple(cu[i][rs:re_]),
                seq_starts=tuple(starts[i][rs:re_]),
                cache="kv_cache",
                table="block_table",
                first=nd + rs,
            )
            for i, (t, (rs, re_)) in enumerate(zip(out["context_seq_tot"].tolist(), out["context_requests"].tolist()))
        ]
    ws = out["workspace_starts"].tolist()
    return [
        PlannedGather(
            total=t,
            batch_size=e - s,
            ws=tuple(ws[s:e]),
            seq_starts=(0,) * (e - s),
            cache="kv_cache",
            table="block_table",
            first=nd + s,
        )
        for (s, e), t in zip(out["prefill_chunks"].tolist(), out["prefill_chunk_seq_tot"].tolist())
    ]


def run_step(
    fn: Callable,
    case: Case,
    t: Mapping[str, Any],
    sub: Callable[[str], Callable],
    *,
    recorder: Callable[..., SubCallRecorder] = SubCallRecorder,
) -> tuple[dict[str, Any], SubCallRecorder]:
    """Call a step implementation on the case's tensors ``t`` with recording sub-impls (made by
    ``recorder``, which takes SubCallRecorder's fields); (outputs, recorder)."""
    p = case.params
    world = p.get("dcp_world_size", 1)
    dcp = (world, p.get("dcp_interleave", 1), t["dcp_block_table"]) if world > 1 and runs_dcp(case) else None
    rec = recorder(convert_fn=sub("convert"), gather_fn=sub("gather"), block_table=t["block_table"], dcp=dcp)
    out = dict(
        fn(
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
            block_n=p["block_n"],
            convert=rec.convert,
            gather=rec.gather,
            plan=lambda *args: sub("plan")(*args),  # loaded when the pipeline plans with it
            dcp_world_size=world,
            dcp_interleave=p.get("dcp_interleave", 1),
            dcp_kv_cache=t.get("dcp_kv_cache"),
            dcp_block_table=t.get("dcp_block_table"),
        )
    )
    return out, rec


def runs_dcp(case: Case) -> bool:
    """Whether the case's context gathers run under DCP: a world over 1 and a revision whose
    context chunks come from the packing planner (SPEC 9.1)."""
    p = case.params
    planner = revisions.get(p.get("revision") or revisions.newest()).rule("context_chunks") == "packing_planner"
    return p.get("dcp_world_size", 1) > 1 and planner
