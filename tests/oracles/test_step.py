"""The step oracle: its loop and vectorized versions agree, and it states SPEC 5.2's invariant."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.generators.draw import Knobs
from mlafuzz.oracles.gather import gather
from mlafuzz.oracles.metadata import chunked_context, chunked_context_violations
from mlafuzz.oracles.step import step_oracle
from mlafuzz.tests.support.helpers import draw_spec, materialize

TINY = Knobs(
    max_requests=3,
    max_seq_len=40,
    max_tokens_per_request=2,
    block_sizes=(4, 1, 3),
    block_ns=(16,),
    topk_multiples=(1, 2),
)


def _oracle(case, *, loop: bool):
    t, p = case.tensors, case.params
    return step_oracle(
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
        loop=loop,
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.parametrize("seed", range(8))
def test_loop_and_vectorized_step_oracles_agree_bit_for_bit(seed):
    spec = draw_spec("step", seed=seed, knobs=TINY)
    case = materialize(spec, seed, "cpu")
    fast, slow = _oracle(case, loop=False), _oracle(case, loop=True)
    assert fast.keys() == slow.keys()
    for name in fast:
        assert fast[name].dtype == slow[name].dtype and fast[name].shape == slow[name].shape, name
        # NaN rows: the loop and vectorized dequant both emit the canonical 0x7FC0.
        assert torch.equal(_bits(fast[name]), _bits(slow[name])), name


@pytest.mark.parametrize("seed", range(12))
def test_context_rows_equal_the_chunked_gathers_of_section_5_2(seed):
    """The oracle states the invariant directly; the chunked path of 5.2 must land on the same rows."""
    spec = draw_spec("step", seed=seed)
    case = materialize(spec, seed, "cpu")
    out = _oracle(case, loop=False)
    if not int(out["dense_route"]):
        assert out["context_rows"].shape == (0, 576)
        return
    nd = int(out["num_decodes"])
    t = case.tensors
    qsl, sl = t["query_start_loc"].tolist(), t["seq_lens"].tolist()
    ctx = [sl[r] - (qsl[r + 1] - qsl[r]) for r in range(nd, len(sl))]
    plan = chunked_context(context_lens=ctx, workspace_rows=spec.workspace_rows, block_size=spec.paging.block_size)
    assert chunked_context_violations(context_lens=ctx, chunked=plan, workspace_rows=spec.workspace_rows) == []
    starts, lens, cu, tot = plan.tensors()
    per_request: list[list[torch.Tensor]] = [[] for _ in ctx]
    for i in range(plan.n_chunks):
        rows = gather(
            src_cache=t["kv_cache"],
            block_table=t["block_table"][nd:],
            workspace_starts=cu[i],
            batch_size=len(ctx),
            seq_starts=starts[i],
            total=int(tot[i]),
        )
        for r in range(len(ctx)):
            per_request[r].append(rows[int(cu[i, r]) : int(cu[i, r]) + int(lens[i, r])])
    chunks = [x for xs in per_request for x in xs]
    want = torch.cat(chunks) if chunks else torch.empty((0, 576), dtype=torch.bfloat16)
    assert torch.equal(_bits(out["context_rows"]), _bits(want))
    assert out["context_seq_tot"].tolist() == list(plan.seq_tot)
