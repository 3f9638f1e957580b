"""SPEC section 5's hand-worked examples, through our step pipeline (kernels/step_pipeline.py).

Each example is a StepSpec; the pipeline runs with the CPU sub-impls
(convert=triton interpreted, gather=torch) behind the harness's recorders,
and must agree with the step oracle on every output (run_case: no finding).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlafuzz.generators.ops.step import StepRequest as R
from mlafuzz.generators.ops.step import StepSpec
from mlafuzz.generators.spec import Paging
from mlafuzz.harness.ops.step_calls import StepCallError, run_step
from mlafuzz.oracles.codec import dequant_records
from mlafuzz.tests.support.helpers import materialize, resolve, run_case, session

# SPEC 5's examples are of the equal-width chunks (context_chunks equal_width: 2026-09 and before);
# SPEC 9.1's packing planner is revision 2026-10's.
EQUAL_WIDTH, PLANNER = "2026-09", "2026-10"


def _at(case, revision: str):
    return dataclasses.replace(case, params={**case.params, "revision": revision})


def _run(spec: StepSpec, impl: str = "ours", seed: int = 0, revision: str = EQUAL_WIDTH):
    case = _at(materialize(spec, seed, "cpu"), revision)
    s = session()
    fn = s.load(resolve("step", impl), "cpu", revision=revision)
    out, rec = run_step(fn, case, case.cloned_tensors(), s.sub("cpu"))
    return case, out, rec


def _agrees_with_oracle(spec: StepSpec, seed: int = 0, revision: str = EQUAL_WIDTH) -> None:
    case = _at(materialize(spec, seed, "cpu"), revision)
    result = run_case(case=case, entry=resolve("step", "ours"), rerun=True)
    assert result.findings == (), [f.message for f in result.findings]


def _counts(out) -> tuple[int, int, int, int]:
    return tuple(int(out[n]) for n in ("num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens"))


def _context(case, request: int, n: int) -> torch.Tensor:
    """Positions 0..n-1 of a request, dequantized straight from the cache."""
    cache, table = case.tensors["kv_cache"], case.tensors["block_table"]
    bs = cache.shape[1]
    return dequant_records(torch.stack([cache[int(table[request, p // bs]), p % bs] for p in range(n)]))


# --- 5.1: the split, resolved once --------------------------------------------


@pytest.mark.parametrize(
    "lens, threshold, uniform, counts",
    [
        ([1, 2, 3], 128, True, (1, 2, 1, 5)),  # uniform rule: prefills start at the first differing length
        ([1, 2, 3], 128, False, (3, 0, 6, 0)),  # everything under the threshold is a decode
        ([1, 2, 3], 2, False, (2, 1, 3, 3)),
        ([5, 6], 4, True, (0, 2, 0, 11)),  # the first request over the threshold: no decodes
    ],
)
def test_split_hand_worked_examples(lens, threshold, uniform, counts):
    spec = StepSpec(
        requests=tuple(R(context_len=5, query_len=q) for q in lens),
        threshold=threshold,
        require_uniform=uniform,
        paging=Paging(block_size=4),
        workspace_rows=64,
    )
    _case, out, _rec = _run(spec)
    assert _counts(out) == counts
    _agrees_with_oracle(spec)


def test_padded_uniform_decodes_are_all_decodes_with_padding_tokens():
    spec = StepSpec(
        requests=(R(context_len=7, query_len=2), R(context_len=7, query_len=2), R(context_len=0, query_len=0)),
        threshold=128,
        paging=Paging(block_size=4),
    )
    _case, out, rec = _run(spec)
    assert _counts(out) == (3, 0, 6, 0)
    assert (int(out["decode_query_len"]), int(out["num_active_decodes"])) == (2, 3)
    assert out["decode_slots"].shape == (6, spec.topk) and bool((out["decode_slots"][4:] == -1).all())
    assert [c.rows for c in rec.converts] == [6] and rec.gathers == []
    _agrees_with_oracle(spec)


# --- 5.3: fp8 separate metadata; 5.2: chunked context ------------------------


def _fp8_example(workspace_rows: int, topk: int) -> StepSpec:
    # Two decodes of query_len 1, then prefill-side seq_lens [10, 15, 20, 5] (SPEC 5.3 / vLLM's example).
    return StepSpec(
        requests=(
            R(context_len=4, query_len=1),
            R(context_len=5, query_len=1),
            R(context_len=8, query_len=2),
            R(context_len=13, query_len=2),
            R(context_len=0, query_len=20),
            R(context_len=0, query_len=5),
        ),
        paging=Paging(block_size=4),
        topk=topk,
        block_n=16,
        workspace_rows=workspace_rows,
    )


@pytest.mark.parametrize("workspace_rows", [25, 30, 44])
def test_fp8_separate_example_workspace_starts_restart_per_chunk(workspace_rows):
    spec = _fp8_example(workspace_rows, topk=32)  # every prefill seq_len <= 32: dense route
    case, out, rec = _run(spec)
    assert _counts(out) == (2, 4, 2, 29)
    assert out["prefill_chunks"].tolist() == [[0, 2], [2, 4]]
    assert out["workspace_starts"].tolist() == [0, 10, 0, 20]
    assert out["prefill_chunk_seq_tot"].tolist() == [25, 25]
    assert out["prefill_request_ids"].tolist() == [-1, -1, 0, 0, 1, 1] + [2] * 20 + [3] * 5
    assert int(out["dense_route"]) == 1 and out["prefill_slots"].shape == (0, 32)
    # SPEC 5.4: only the two decode tokens went to convert.
    assert [(c.rows, c.workspace) for c in rec.converts] == [(2, False)]
    # The extends' contexts (8 and 13 tokens) arrive whole, in order.
    want = torch.cat([_context(case, 2, 8), _context(case, 3, 13)])
    assert torch.equal(out["context_rows"].view(torch.int16), want.view(torch.int16))
    _agrees_with_oracle(spec)


def test_sparse_route_converts_prefill_rows_to_workspace_offsets():
    spec = _fp8_example(25, topk=16)  # seq_len 20 > K = 16: the sparse route
    case, out, rec = _run(spec)
    assert int(out["dense_route"]) == 0
    assert [(c.rows, c.workspace) for c in rec.converts] == [(2, False), (29, True)]
    ids, ws = out["prefill_request_ids"][2:].long(), out["workspace_starts"].long()
    tok = case.tensors["topk_indices"][2:].long()
    want = torch.where(tok >= 0, ws[ids][:, None] + tok, -1)
    assert torch.equal(out["prefill_slots"].long(), want)
    # One gather per 5.3 chunk, whole sequences from position 0, workspace_starts restarting at 0.
    assert [(g.total, g.ws, g.seq_starts) for g in rec.gathers] == [(25, (0, 10), None), (25, (0, 20), None)]
    assert out["prefill_seq_rows"].shape == (50, 576)
    _agrees_with_oracle(spec)


def _chunked_example() -> StepSpec:
    # Prefill-side contexts [10, 3, 7, 0], W = 8, bs = 2: chunk = 8 // 3 = 2, five chunks.
    return StepSpec(
        requests=(
            R(context_len=10, query_len=2),
            R(context_len=3, query_len=2),
            R(context_len=7, query_len=2),
            R(context_len=0, query_len=3),
        ),
        paging=Paging(block_size=2),
        topk=16,
        block_n=16,
        workspace_rows=8,
    )


def test_chunked_context_example_gathers_each_chunk_with_its_seq_starts():
    case, out, rec = _run(_chunked_example())
    assert int(out["context_chunk"]) == 2
    assert out["context_seq_tot"].tolist() == [6, 5, 4, 3, 2]
    assert out["context_lens"][1].tolist() == [2, 1, 2, 0]
    assert out["context_cu_seq_lens"][1].tolist() == [0, 2, 3, 5, 5]
    assert out["context_starts"][4].tolist() == [8, 8, 8, 8]
    assert [(g.total, g.seq_starts) for g in rec.gathers] == [(6 - i, (2 * i,) * 4) for i in range(4)] + [(2, (8,) * 4)]
    assert all(g.batch_size == 4 and g.total <= 8 for g in rec.gathers)  # never past the workspace
    # The 5.2 invariant: each context token of each request exactly once, in order, dequantized.
    want = torch.cat([_context(case, 0, 10), _context(case, 1, 3), _context(case, 2, 7)])
    assert torch.equal(out["context_rows"].view(torch.int16), want.view(torch.int16))
    _agrees_with_oracle(_chunked_example())


def test_the_packing_planner_gathers_each_chunk_from_its_row_slice_with_continuation_starts():
    """SPEC 9.1 on [10, 3, 7, 0], W = 8, bs = 2: request 0 is split at 8; the second chunk
    continues it and packs request 1 whole and 2 of request 2 (the aligned piece that fits); the
    third continues request 2, and the request without context ends it."""
    case, out, rec = _run(_chunked_example(), revision=PLANNER)
    assert out["context_requests"].tolist() == [[0, 1], [0, 3], [2, 3]]
    assert out["context_seq_tot"].tolist() == [8, 7, 5]
    calls = [(g.batch_size, g.ws, g.seq_starts, g.total) for g in rec.gathers]
    assert calls == [(1, (0,), (0,), 8), (3, (0, 2, 5), (8, 0, 0), 7), (1, (0,), (2,), 5)]
    table = case.tensors["block_table"].tolist()
    assert [g.table for g in rec.gathers] == [(tuple(table[0]),), tuple(map(tuple, table[0:3])), (tuple(table[2]),)]
    want = torch.cat([_context(case, 0, 10), _context(case, 1, 3), _context(case, 2, 7)])
    assert torch.equal(out["context_rows"].view(torch.int16), want.view(torch.int16))
    _agrees_with_oracle(_chunked_example(), revision=PLANNER)


def test_under_dcp_each_rank_gathers_its_padded_local_rows_from_its_local_starts():
    """SPEC 9.1 with D = 2, I = 2 (V = 4) on [10, 3, 7, 0], W = 8, bs = 2: B = 4 rank-local rows,
    alignment lcm(2, 4) = 4, padded(r) = ceil(r / 4) * 2. Request 0 is split at 8 (4 local rows);
    the second chunk continues it from local row 4 and packs request 1; request 2 fits alone."""
    spec = dataclasses.replace(_chunked_example(), dcp_world_size=2, dcp_interleave=2)
    case, out, rec = _run(spec, revision=PLANNER)
    assert out["context_requests"].tolist() == [[0, 1], [0, 2], [2, 3]]
    assert out["context_seq_tot"].tolist() == [8, 5, 7]  # global context tokens per chunk
    calls = [(g.batch_size, g.ws, g.seq_starts, g.total) for g in rec.gathers]
    assert calls == [(1, (0,), (0,), 4)] * 2 + [(2, (0, 2), (4, 0), 4)] * 2 + [(1, (0,), (0,), 4)] * 2
    want = torch.cat([_context(case, 0, 10), _context(case, 1, 3), _context(case, 2, 7)])
    assert torch.equal(out["context_rows"].view(torch.int16), want.view(torch.int16))
    _agrees_with_oracle(spec, revision=PLANNER)


def test_without_seq_starts_later_chunks_reread_the_first():
    case, out, _rec = _run(_chunked_example(), impl="step_no_seq_starts")
    first = _context(case, 0, 2)  # request 0's chunk 0
    rows = out["context_rows"][:10]
    assert torch.equal(rows[2:4].view(torch.int16), first.view(torch.int16))  # chunk 1 re-read positions 0, 1
    assert not torch.equal(rows.view(torch.int16), _context(case, 0, 10).view(torch.int16))


# --- 5.4 and 5.3's metadata fix: the planted bugs on their examples ------------


def test_decode_plus_short_prefill_converts_the_decode_subset_only():
    spec = StepSpec(
        requests=(R(context_len=9, query_len=1), R(context_len=0, query_len=6)),
        threshold=1,
        paging=Paging(block_size=4),
        workspace_rows=8,
    )
    _case, out, rec = _run(spec)
    assert _counts(out) == (1, 1, 1, 6) and [c.rows for c in rec.converts] == [1]
    with pytest.raises(StepCallError, match="req_id rows=7 != token_indices rows=1"):
        _run(spec, impl="step_full_req_id")
    _agrees_with_oracle(spec)


def test_a_second_split_with_another_threshold_disagrees_on_spec_decode():
    spec = StepSpec(
        requests=(R(context_len=9, query_len=2), R(context_len=9, query_len=2), R(context_len=4, query_len=5)),
        threshold=2,
        paging=Paging(block_size=4),
    )
    _case, good, _rec = _run(spec)
    _case, bad, rec = _run(spec, impl="step_second_split")
    assert _counts(good) == (2, 1, 4, 5) and _counts(bad) == (0, 3, 0, 9)
    assert [c.rows for c in rec.converts if not c.workspace] == [4]  # the decode path kept the first split


def test_workspace_starts_not_restarted_run_on_across_chunks():
    _case, out, _rec = _run(_fp8_example(25, topk=32), impl="step_ws_not_restarted")
    assert out["workspace_starts"].tolist() == [0, 10, 25, 45]
