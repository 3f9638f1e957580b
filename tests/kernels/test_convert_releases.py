"""Our converts follow vLLM's releases (SPEC 10) as the oracle does: a counted row compacted under a
revision whose ``convert_counted`` rule says so, ``idx_mapping``, and the plain convert's DCP
arguments. Both of ours (Triton under the interpreter, torch) against the oracle on small rows."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # our Triton convert is among the implementations checked

from mlafuzz.kernels import torch_impl, triton_convert  # noqa: E402
from mlafuzz.oracles import convert as oracle
from mlafuzz.oracles.convert import rows_as_sets_equal

OURS = {"triton": triton_convert.convert, "torch": torch_impl.convert_torch}


def i32(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32)


def _rows(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    n, k, r, m, bs = 6, 16, 3, 4, 4
    return dict(
        req_id=torch.randint(0, r, (n,), generator=g, dtype=torch.int32),
        block_table=torch.randint(0, 50, (r, m), generator=g, dtype=torch.int32),
        token_indices=torch.randint(-2, 2 * m * bs + 4, (n, k), generator=g, dtype=torch.int32),
        prefill_workspace_request_ids=i32([-1, 0, -1, 1, -1, 0]),
        prefill_workspace_starts=i32([0, 40]),
        bs=bs,
    )


def _call(fn, rows: dict, **kw):
    return fn(
        rows["req_id"],
        rows["block_table"],
        rows["token_indices"],
        BLOCK_SIZE=rows["bs"],
        NUM_TOPK_TOKENS=rows["token_indices"].shape[1],
        BLOCK_N=8,
        HAS_PREFILL_WORKSPACE=True,
        prefill_workspace_request_ids=rows["prefill_workspace_request_ids"],
        prefill_workspace_starts=rows["prefill_workspace_starts"],
        return_valid_counts=True,
        **kw,
    )


def _expected(rows: dict, *, compact: bool, **kw):
    return oracle.convert(
        req_id=rows["req_id"],
        block_table=rows["block_table"],
        token_indices=rows["token_indices"],
        block_size=rows["bs"],
        has_prefill_workspace=True,
        prefill_workspace_request_ids=rows["prefill_workspace_request_ids"],
        prefill_workspace_starts=rows["prefill_workspace_starts"],
        compact_to_front=compact,
        **kw,
    )


RELEASES = [
    ({}, {}),
    ({"idx_mapping": i32([2, -1, 0, 1])}, {"idx_mapping": i32([2, -1, 0, 1])}),
    (
        {"dcp_size": 2, "dcp_rank": 1, "cp_kv_cache_interleave_size": 2, "prefill_workspace_rank_stride": 100},
        {"dcp_size": 2, "dcp_rank": 1, "dcp_interleave": 2, "prefill_rank_stride": 100},
    ),
    (
        {"dcp_size": 3, "dcp_rank": 0, "prefill_workspace_rank_stride": None, "idx_mapping": i32([1, 1, 2])},
        {"dcp_size": 3, "dcp_rank": 0, "idx_mapping": i32([1, 1, 2])},
    ),
]


@pytest.mark.parametrize("impl", sorted(OURS))
@pytest.mark.parametrize("revision", ["2026-10", "2026-11"])
@pytest.mark.parametrize("args", range(len(RELEASES)))
def test_ours_follow_the_revision_and_the_releases_arguments_as_the_oracle(impl, revision, args):
    theirs, mine = RELEASES[args]
    rows = _rows(args)
    out, counts = _call(OURS[impl], rows, revision=revision, **theirs)
    compact = revision == "2026-11"  # its convert_counted rule is compact, 2026-10's in_place
    exp_out, exp_counts = _expected(rows, compact=compact, **mine)
    assert torch.equal(counts, exp_counts)
    if compact:
        assert bool(rows_as_sets_equal(expected=exp_out, actual=out, counts=exp_counts).all())
    else:
        assert torch.equal(out, exp_out)


@pytest.mark.parametrize("impl", sorted(OURS))
def test_a_compacted_row_written_into_a_reused_out_leaves_no_stale_slot_in_its_tail(impl):
    rows = _rows(7)
    out = torch.full(tuple(rows["token_indices"].shape), 12345, dtype=torch.int32)
    counts = torch.full((rows["token_indices"].shape[0],), 99, dtype=torch.int32)
    res, res_counts = _call(OURS[impl], rows, revision="2026-11", out=out, valid_counts_out=counts)
    tail = torch.arange(out.shape[1]) >= res_counts.unsqueeze(1)
    assert res is out and res_counts is counts
    assert bool((out[tail] == -1).all()) and not bool((out == 12345).any())


@pytest.mark.parametrize("impl", sorted(OURS))
def test_a_width_that_is_a_multiple_of_block_n_but_not_a_power_of_two_is_converted(impl):
    # vLLM 0.31.0 runs such a counted row as one tile padded to next_pow2(K) (GLM's K = 2176 = 17 * 128);
    # small here: K = 3 * BLOCK_N.
    rows = _rows(11)
    rows["token_indices"] = torch.cat([rows["token_indices"], rows["token_indices"][:, :8].flip(1)], dim=1)
    out, counts = _call(OURS[impl], rows, revision="2026-11")
    exp_out, exp_counts = _expected(rows, compact=True)
    assert out.shape == (6, 24) and torch.equal(counts, exp_counts)
    assert bool(rows_as_sets_equal(expected=exp_out, actual=out, counts=exp_counts).all())


def test_the_releases_arguments_are_capabilities_read_from_a_signature_like_vllm_0_34s():
    from mlafuzz.kernels.external import adapt_signature

    def released(
        req_id, block_table, token_indices, BLOCK_SIZE=64, BLOCK_STRIDE_ROWS=None, NUM_TOPK_TOKENS=2048,
        BLOCK_N=128, HAS_PREFILL_WORKSPACE=False, prefill_workspace_request_ids=None,
        prefill_workspace_starts=None, prefill_workspace_rank_stride=None, dcp_size=1, dcp_rank=0,
        cp_kv_cache_interleave_size=1, return_valid_counts=False, out=None, valid_counts_out=None,
        idx_mapping=None,
    ):  # fmt: skip
        return None

    def dcp_without_stride(req_id, block_table, token_indices, dcp_size=1, dcp_rank=0, cp_kv_cache_interleave_size=1):
        return None

    _, caps = adapt_signature("convert", released)
    assert caps == {"block_stride_rows", "caller_out", "idx_mapping", "dcp_args"}
    assert adapt_signature("convert", dcp_without_stride)[1] == frozenset()  # all four, or none passed
