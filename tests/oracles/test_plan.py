"""The packing chunk planner's oracle (SPEC 9.1): the rule on hand-checked batches (the scenarios of
vLLM's own tests, tests/v1/attention/test_mla_context_chunks.py, re-derived by hand), and its plans
keep every invariant on drawn arguments."""

from __future__ import annotations

import pytest

from mlafuzz.generators.draw import RandomDrawer
from mlafuzz.generators.ops.plan import PlanSpec, call_site, draw
from mlafuzz.generators.spec import SpecError
from mlafuzz.oracles.plan import Chunk, padded_rows_of, plan_loop, problems


def _plan(spec: PlanSpec) -> list[Chunk]:
    return plan_loop(
        context_lens=list(spec.context_lens),
        row_budget=spec.row_budget,
        max_context_chunk=spec.max_context_chunk,
        split_alignment=spec.split_alignment,
        padded_rows=spec.padded_rows,
    )


def test_a_long_request_is_split_on_a_block_and_only_its_next_chunk_continues():
    plan = _plan(call_site(context_lens=(2048, 32, 32), workspace_rows=1024, block_size=16))
    assert plan == [
        Chunk(0, 1, (0,), (1024,), False),
        Chunk(0, 1, (1024,), (1024,), True),  # nothing of request 1 fits after it: k = 0 closes the chunk
        Chunk(1, 3, (0, 0), (32, 32), False),
    ]


def test_a_request_without_context_is_in_no_chunk_and_ends_the_one_before_it():
    plan = _plan(call_site(context_lens=(64, 0, 64, 0), workspace_rows=1024, block_size=16))
    assert plan == [Chunk(0, 1, (0,), (64,), False), Chunk(2, 3, (0,), (64,), False)]
    assert _plan(call_site(context_lens=(0, 0), workspace_rows=1024, block_size=16)) == []


def test_max_context_chunk_caps_a_split_piece_but_not_a_whole_context_that_fits():
    spec = PlanSpec(context_lens=(100, 300), row_budget=256, max_context_chunk=32, split_alignment=16)
    assert _plan(spec) == [
        Chunk(0, 2, (0, 0), (100, 32), False),
        Chunk(1, 2, (32,), (32,), True),  # 268 left does not fit: a piece of at most 32
        Chunk(1, 2, (64,), (236,), True),  # 236 left fits whole, 32 or not
    ]


def test_under_dcp_the_local_rows_of_each_request_tile_its_padded_local_context():
    spec = call_site(
        context_lens=(3000, 200, 200), workspace_rows=1024, block_size=128, dcp_world_size=2, interleave=64
    )
    assert (spec.row_budget, spec.split_alignment, spec.padded_rows(1)) == (512, 128, 64)
    cursor: dict[int, int] = {}
    for c in _plan(spec):
        assert sum(spec.padded_rows(s + n) - spec.padded_rows(s) for s, n in zip(c.starts, c.seq_lens)) <= 512
        for j, (s, n) in enumerate(zip(c.starts, c.seq_lens)):
            local = spec.padded_rows(s)
            assert local == cursor.get(c.request_start + j, 0)
            cursor[c.request_start + j] = local + spec.padded_rows(s + n) - local
    assert cursor == {r: -(-n // 128) * 64 for r, n in enumerate((3000, 200, 200))}


def test_padded_rows_is_the_identity_without_dcp():
    assert [padded_rows_of(dcp_world_size=1, interleave=1)(r) for r in (0, 1, 77)] == [0, 1, 77]
    assert [padded_rows_of(dcp_world_size=4, interleave=8)(r) for r in (0, 1, 32, 33)] == [0, 8, 8, 16]


def test_a_budget_that_holds_no_aligned_piece_is_not_a_valid_call():
    with pytest.raises(SpecError, match="row_budget"):
        PlanSpec(context_lens=(10,), row_budget=8, max_context_chunk=16, split_alignment=16)


def test_the_oracles_plans_keep_every_invariant_on_drawn_arguments():
    for seed in range(400):
        spec = draw(RandomDrawer(seed))
        plan = _plan(spec)
        assert problems(
            plan,
            context_lens=list(spec.context_lens),
            row_budget=spec.row_budget,
            split_alignment=spec.split_alignment,
            padded_rows=spec.padded_rows,
        ) == dict.fromkeys(problems([], context_lens=[], row_budget=1, split_alignment=1, padded_rows=int)), spec


def test_the_invariants_name_what_a_wrong_plan_breaks():
    kw = dict(context_lens=[40, 8], row_budget=32, split_alignment=16, padded_rows=lambda r: r)
    broken = problems([Chunk(0, 1, (0,), (24,), False), Chunk(0, 2, (24, 0), (16, 8), True)], **kw)
    assert broken["aligned_starts"] and broken["rows_in_budget"] is None and broken["covered_once_in_order"] is None
    broken = problems([Chunk(0, 2, (0, 4), (32, 4), False)], **kw)
    assert broken["continuation_first_only"] and broken["rows_in_budget"] and broken["covered_once_in_order"]
