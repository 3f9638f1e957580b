"""The step spec: validation, JSON round trip, materialized tensors, features, drawing."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings

from mlafuzz.generators.ops.step import StepRequest as R
from mlafuzz.generators.ops.step import StepSpec
from mlafuzz.generators.spec import Paging, SpecError, spec_to_json
from mlafuzz.tests.support.helpers import draw_spec, features, materialize, spec_from_json, specs


def _esc(text: str) -> str:
    return text.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: StepSpec(requests=()), "requests=()"),
        (lambda: StepSpec(requests=(R(context_len=0, query_len=0),)), "requests[0].query_len=0"),
        # A prefill (no context) before a decode: the scheduler orders decode -> extend -> prefill.
        (lambda: StepSpec(requests=(R(context_len=0, query_len=3), R(context_len=5, query_len=1))), "requests[1]="),
        # An extend (query_len > threshold) before a decode.
        (
            lambda: StepSpec(requests=(R(context_len=5, query_len=3), R(context_len=5, query_len=1))),
            "is a decode after",
        ),
        # Padding requests form the tail.
        (
            lambda: StepSpec(
                requests=(R(context_len=5, query_len=1), R(context_len=0, query_len=0), R(context_len=0, query_len=2))
            ),
            "requests[1].query_len=0",
        ),
        # Two prefill requests with context need two blocks of workspace.
        (
            lambda: StepSpec(
                requests=(R(context_len=5, query_len=3), R(context_len=5, query_len=3)),
                paging=Paging(block_size=16),
                workspace_rows=31,
            ),
            "workspace_rows=31",
        ),
        # Without the uniform rule the decodes [2, 1] give 3 decode tokens: not a multiple of 2.
        (
            lambda: StepSpec(
                requests=(R(context_len=5, query_len=2), R(context_len=5, query_len=1)),
                threshold=2,
                require_uniform=False,
            ),
            "require_uniform=False",
        ),
        (lambda: StepSpec(requests=(R(context_len=5, query_len=1),), topk=48, block_n=32), "topk=48"),
        (lambda: R(context_len=-1, query_len=1), "context_len=-1"),
    ],
)
def test_invalid_steps_are_refused_with_name_equals_value(make, message):
    with pytest.raises(SpecError, match=_esc(message)):
        make()


@given(spec=specs("step"))
@settings(max_examples=40)
def test_every_drawn_step_survives_a_json_round_trip(spec):
    assert spec_from_json(spec_to_json(spec)) == spec


def test_padded_uniform_decode_batch_counts_padding_tokens():
    spec = StepSpec(
        requests=(R(context_len=7, query_len=2), R(context_len=7, query_len=2), R(context_len=0, query_len=0)),
        threshold=128,
    )
    assert spec.num_tokens == 6 and spec.split() == (3, 0, 6, 0)
    case = materialize(spec, 0, "cpu")
    # The padding tokens 4 and 5 belong to the zero-length request (2 = q0 of them), all -1 rows.
    assert case.tensors["req_id_per_token"].tolist() == [0, 0, 1, 1, 2, 2]
    assert bool((case.tensors["topk_indices"][4:] == -1).all())
    assert case.tensors["query_start_loc"].tolist() == [0, 2, 4, 4]


@pytest.mark.parametrize("seed", range(6))
def test_materialized_step_tensors_follow_spec_section_1(seed):
    spec = draw_spec("step", seed=seed)
    case = materialize(spec, seed, "cpu")
    t = case.tensors
    n, k = len(spec.requests), spec.topk
    assert t["query_start_loc"].dtype == torch.int32 and t["query_start_loc"].shape == (n + 1,)
    assert t["seq_lens"].tolist() == [r.seq_len for r in spec.requests]
    assert t["req_id_per_token"].shape == (spec.num_tokens,) and t["req_id_per_token"].dtype == torch.int32
    assert t["topk_indices"].shape == (spec.num_tokens, k) and t["topk_indices"].dtype == torch.int32
    seq = t["seq_lens"].to(torch.int64)[t["req_id_per_token"].to(torch.int64)]
    idx = t["topk_indices"]
    assert bool(((idx == -1) | ((idx >= 0) & (idx < seq[:, None]))).all())  # request-local positions or -1
    assert t["kv_cache"].dtype == torch.uint8 and t["kv_cache"].shape[1:] == (spec.paging.block_size, 656)
    again = materialize(spec, seed, "cpu")
    assert all(torch.equal(t[name], again.tensors[name]) for name in t)


def test_drawn_steps_cover_the_corners_the_pipeline_has():
    seen = set()
    for seed in range(80):
        seen |= features(draw_spec("step", seed=seed))
    assert {
        "batch:decode-only",
        "batch:prefill-only",
        "batch:mixed",
        "multi-chunk",
        "spec-decode",
        "padded-requests",
        "dense-prefill",
        "sparse-prefill",
        "prefill-chunks>1",
    } <= seen


def _dcp_caches_loop(spec, cache, table):
    """The per-rank, per-request loop the materializer's DCP caches are held to: rank k's request r
    owns ceil(padded / bs) contiguous local blocks; local position j holds context position
    p = (j // I) * D*I + k*I + j % I when p < context_len, else a zero record."""
    world, inter, bs = spec.dcp_world_size, spec.dcp_interleave, spec.paging.block_size
    virtual = world * inter
    ctx = [r.context_len for r in spec.requests]
    n_req = len(ctx)
    blocks = [max(1, -(-(-(-c // virtual) * inter) // bs)) for c in ctx]
    per_rank = sum(blocks)
    first = [sum(blocks[:r]) for r in range(n_req)]
    local_table = torch.zeros((world * n_req, max(blocks)), dtype=torch.int32)
    records = torch.zeros((world * per_rank * bs, cache.shape[-1]), dtype=torch.uint8)
    flat = cache.reshape(-1, cache.shape[-1])
    for k in range(world):
        for r in range(n_req):
            base = k * per_rank + first[r]
            local_table[k * n_req + r, : blocks[r]] = torch.arange(blocks[r], dtype=torch.int32) + base
            for j in range(blocks[r] * bs):
                p = (j // inter) * virtual + k * inter + j % inter
                if p < ctx[r]:
                    records[base * bs + j] = flat[int(table[r, p // bs]) * bs + p % bs]
    return records.reshape(world * per_rank, bs, cache.shape[-1]), local_table


@pytest.mark.parametrize("world, inter, bs", [(2, 1, 1), (2, 4, 16), (3, 2, 4), (4, 64, 16), (8, 1, 2)])
def test_every_rank_holds_its_positions_records_and_zeros_elsewhere(world, inter, bs):
    align = math.lcm(bs, world * inter)
    spec = StepSpec(
        requests=(
            R(context_len=37, query_len=1),
            R(context_len=1, query_len=1),
            R(context_len=200, query_len=3),
            R(context_len=0, query_len=5),
        ),
        paging=Paging(block_size=bs),
        threshold=1,
        require_uniform=False,
        workspace_rows=align * 4,
        dcp_world_size=world,
        dcp_interleave=inter,
    )
    t = materialize(spec, 3, "cpu").tensors
    want_cache, want_table = _dcp_caches_loop(spec, t["kv_cache"], t["block_table"])
    assert torch.equal(t["dcp_block_table"], want_table)
    assert torch.equal(t["dcp_kv_cache"], want_cache)


@pytest.mark.parametrize("seed", range(40))
def test_drawn_dcp_steps_hold_the_loops_records(seed):
    spec = draw_spec("step", seed=seed)
    if spec.dcp_world_size == 1:
        spec = dataclasses.replace(
            spec,
            dcp_world_size=2,
            dcp_interleave=2,
            workspace_rows=max(spec.workspace_rows, math.lcm(spec.paging.block_size, 4)),
        )
    t = materialize(spec, seed, "cpu").tensors
    want_cache, want_table = _dcp_caches_loop(spec, t["kv_cache"], t["block_table"])
    assert torch.equal(t["dcp_block_table"], want_table)
    assert torch.equal(t["dcp_kv_cache"], want_cache)
