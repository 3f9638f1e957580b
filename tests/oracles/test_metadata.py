"""Tests for mlafuzz.oracles.metadata / fp8_separate (SPEC.md sections 5.1-5.3)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.oracles.codec import RECORD_BYTES, dequant_records
from mlafuzz.oracles.gather import gather
from mlafuzz.oracles.metadata import (
    ChunkedContext,
    chunked_context,
    chunked_context_loop,
    chunked_context_rows,
    chunked_context_violations,
    fp8_separate_metadata,
    fp8_separate_metadata_loop,
    split_decodes_and_prefills,
    split_decodes_and_prefills_loop,
)

FAST = settings(max_examples=60, deadline=None)


def split_both(**kw: object) -> tuple[int, int, int, int]:
    a = split_decodes_and_prefills(**kw)  # type: ignore[arg-type]
    assert a == split_decodes_and_prefills_loop(**kw)  # type: ignore[arg-type]
    return a


# ------------------------------------------------------------------ 5.1


def test_split_hand_worked_example_uniform_rule_starts_prefills_at_first_differing_len() -> None:
    # lens [1, 2, 3]: all <= 128, but require_uniform with threshold > 1 skips
    # the all-decodes rule; lens[1] != lens[0] so prefills start at request 1.
    assert split_both(query_start_loc=[0, 1, 3, 6], threshold=128, require_uniform=True) == (1, 2, 1, 5)
    assert split_both(
        query_start_loc=torch.tensor([0, 1, 3, 6], dtype=torch.int32), threshold=128, require_uniform=True
    ) == (1, 2, 1, 5)


def test_split_without_uniformity_everything_under_threshold_is_decode() -> None:
    assert split_both(query_start_loc=[0, 1, 3, 6], threshold=128, require_uniform=False) == (3, 0, 6, 0)
    assert split_both(query_start_loc=[0, 1, 3, 6], threshold=1, require_uniform=True) == (1, 2, 1, 5)
    assert split_both(query_start_loc=[0, 1, 3, 6], threshold=2, require_uniform=False) == (2, 1, 3, 3)


def test_split_first_request_over_threshold_means_no_decodes() -> None:
    assert split_both(query_start_loc=[0, 5, 6], threshold=4, require_uniform=False) == (0, 2, 0, 6)
    assert split_both(query_start_loc=[0, 5, 6], threshold=4, require_uniform=True) == (0, 2, 0, 6)


def test_split_uniform_padding_with_zero_lengths_is_all_decodes() -> None:
    assert split_both(query_start_loc=[0, 2, 4, 4], threshold=128, require_uniform=True, num_tokens=6) == (3, 0, 6, 0)
    with pytest.raises(ValueError, match="tokens not padded correctly"):
        split_decodes_and_prefills(query_start_loc=[0, 2, 4, 4], threshold=128, require_uniform=True)
    with pytest.raises(ValueError, match="tokens not padded correctly"):
        split_decodes_and_prefills_loop(query_start_loc=[0, 2, 4, 4], threshold=128, require_uniform=True)
    # A zero-length request in a non-uniform batch differs from lens[0].
    assert split_both(query_start_loc=[0, 2, 2, 5], threshold=128, require_uniform=True) == (1, 2, 2, 3)


def test_split_empty_batch() -> None:
    assert split_both(query_start_loc=[0], threshold=128, require_uniform=True) == (0, 0, 0, 0)


@st.composite
def qsl_lists(draw: st.DrawFn) -> list[int]:
    lens = draw(st.lists(st.integers(0, 6), min_size=1, max_size=6))
    qsl = [0]
    for q in lens:
        qsl.append(qsl[-1] + q)
    return qsl


@FAST
@given(qsl_lists(), st.integers(0, 7), st.booleans())
def test_split_loop_and_reduction_formulations_agree(qsl: list[int], threshold: int, uniform: bool) -> None:
    kw = dict(query_start_loc=qsl, threshold=threshold, require_uniform=uniform)
    try:
        got = split_decodes_and_prefills(**kw)
    except ValueError:
        with pytest.raises(ValueError):
            split_decodes_and_prefills_loop(**kw)
        return
    assert got == split_decodes_and_prefills_loop(**kw)
    nd, npf, ndt, npt = got
    assert nd + npf == len(qsl) - 1 and ndt + npt == qsl[-1] and ndt == qsl[nd]


# ------------------------------------------------------------------ 5.3


def sep_both(**kw: object):  # noqa: ANN201
    a = fp8_separate_metadata(**kw)  # type: ignore[arg-type]
    assert a == fp8_separate_metadata_loop(**kw)  # type: ignore[arg-type]
    return a


@pytest.mark.parametrize("workspace_rows", [25, 30, 44])
def test_fp8_separate_hand_worked_example_workspace_starts_restart_per_chunk(workspace_rows: int) -> None:
    # Two decodes of query_len 1, then prefills with seq_lens [10, 15, 20, 5].
    meta = sep_both(
        query_start_loc=[0, 1, 2, 4, 6, 7, 8],
        seq_lens=[5, 6, 10, 15, 20, 5],
        num_decodes=2,
        num_decode_tokens=2,
        workspace_rows=workspace_rows,
    )
    assert meta.chunks == ((0, 2), (2, 4))
    assert meta.workspace_starts == (0, 10, 0, 20)
    assert meta.chunk_seq_tot == (25, 25)
    assert meta.prefill_request_ids == (-1, -1, 0, 0, 1, 1, 2, 3)
    assert meta.chunk_token_ranges == ((2, 6), (6, 8))
    assert (meta.decode_query_len, meta.num_active_decodes) == (1, 2)
    assert (meta.num_prefills, meta.num_prefill_tokens) == (4, 6)


def test_fp8_separate_padded_decodes_drop_out_of_active_count() -> None:
    meta = sep_both(
        query_start_loc=[0, 2, 4, 4], seq_lens=[9, 9, 0], num_decodes=3, num_decode_tokens=4, workspace_rows=8
    )
    assert (meta.decode_query_len, meta.num_active_decodes, meta.num_prefills) == (2, 2, 0)
    assert meta.chunks == () and meta.prefill_request_ids == (-1,) * 4


def test_fp8_separate_oversized_prefill_gets_its_own_chunk() -> None:
    meta = sep_both(
        query_start_loc=[0, 3, 5, 6], seq_lens=[4, 50, 3], num_decodes=0, num_decode_tokens=0, workspace_rows=10
    )
    assert meta.chunks == ((0, 1), (1, 2), (2, 3))
    assert meta.workspace_starts == (0, 0, 0) and meta.chunk_seq_tot == (4, 50, 3)
    assert (meta.decode_query_len, meta.num_active_decodes) == (0, 0)


def test_fp8_separate_rejects_non_multiple_decode_tokens() -> None:
    with pytest.raises(ValueError, match="num_decode_tokens=3"):
        fp8_separate_metadata(
            query_start_loc=[0, 2, 4], seq_lens=[5, 5], num_decodes=2, num_decode_tokens=3, workspace_rows=8
        )


@FAST
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 12)), min_size=1, max_size=7), st.integers(0, 40), st.data()
)
def test_fp8_separate_loop_and_cumsum_formulations_agree(reqs: list[tuple[int, int]], w: int, data) -> None:
    qsl = [0]
    for q, _ in reqs:
        qsl.append(qsl[-1] + q)
    seq_lens = [q + c for q, c in reqs]
    nd = data.draw(st.integers(0, len(reqs)))
    if nd and qsl[1] == 0:
        nd = 0
    dql = qsl[1] - qsl[0] if nd else 1
    ndt = qsl[nd] - qsl[nd] % dql
    meta = sep_both(query_start_loc=qsl, seq_lens=seq_lens, num_decodes=nd, num_decode_tokens=ndt, workspace_rows=w)
    # every prefill is in exactly one chunk, chunks fit unless a lone prefill
    covered = [k for s, e in meta.chunks for k in range(s, e)]
    assert covered == list(range(len(reqs) - nd))
    for (s, e), tot in zip(meta.chunks, meta.chunk_seq_tot):
        assert tot <= w or e - s == 1
        assert [meta.workspace_starts[k] for k in range(s, e)] == [sum(seq_lens[nd + s : nd + k]) for k in range(s, e)]


# ------------------------------------------------------------------ 5.2


def test_chunked_context_requests_without_context_are_not_in_the_divisor() -> None:
    c = chunked_context(context_lens=[0, 10, 3, 7], workspace_rows=8, block_size=2)
    assert c == chunked_context_loop(context_lens=[0, 10, 3, 7], workspace_rows=8, block_size=2)
    assert (c.chunk, c.n_chunks) == (2, 5)  # 8 // 3 = 2, already a multiple of 2
    assert c.lens[1] == (0, 2, 1, 2) and c.cu_seq_lens[1] == (0, 0, 2, 3, 5)
    assert c.starts[4] == (8, 8, 8, 8) and c.seq_tot == (6, 5, 4, 3, 2)
    starts, lens, cu, tot = c.tensors()
    assert starts.shape == (5, 4) and cu.shape == (5, 5) and tot.dtype == torch.int32


def test_chunked_context_edge_cases() -> None:
    none = chunked_context(context_lens=[0, 0], workspace_rows=8, block_size=4)
    assert none == ChunkedContext(n_requests=2, chunk=0, n_chunks=0, starts=(), lens=(), cu_seq_lens=(), seq_tot=())
    assert none.tensors()[2].shape == (0, 3)
    for fn in (chunked_context, chunked_context_loop):
        with pytest.raises(ValueError, match="chunk=0"):
            fn(context_lens=[5, 5, 5], workspace_rows=8, block_size=4)  # 8 // 3 = 2 -> 0


@FAST
@given(st.lists(st.integers(0, 20), min_size=1, max_size=5), st.integers(1, 40), st.sampled_from([1, 2, 3, 4, 8]))
def test_chunked_context_invariant_every_token_once_in_order(ctx: list[int], w: int, bs: int) -> None:
    try:
        c = chunked_context(context_lens=ctx, workspace_rows=w, block_size=bs)
    except ValueError:
        with pytest.raises(ValueError):
            chunked_context_loop(context_lens=ctx, workspace_rows=w, block_size=bs)
        assert (w // sum(1 for x in ctx if x > 0)) < bs
        return
    assert c == chunked_context_loop(context_lens=ctx, workspace_rows=w, block_size=bs)
    assert chunked_context_violations(context_lens=ctx, chunked=c, workspace_rows=w) == []
    assert c.chunk % bs == 0 if c.n_chunks else c.chunk == 0


def test_chunked_context_violations_catch_the_seq_starts_bug() -> None:
    c = chunked_context(context_lens=[5, 3], workspace_rows=4, block_size=1)
    buggy = ChunkedContext(
        n_requests=2,
        chunk=c.chunk,
        n_chunks=c.n_chunks,
        starts=tuple((0,) * 2 for _ in c.starts),
        lens=c.lens,
        cu_seq_lens=c.cu_seq_lens,
        seq_tot=c.seq_tot,
    )
    assert chunked_context_violations(context_lens=[5, 3], chunked=buggy, workspace_rows=4)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=3),
    st.integers(4, 12),
    st.sampled_from([1, 2, 3]),
    st.integers(0, 2**20),
)
def test_pipeline_chunked_gather_yields_each_context_dequantized_once_in_order(
    ctx: list[int], w: int, bs: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    try:
        c = chunked_context(context_lens=ctx, workspace_rows=w, block_size=bs)
    except ValueError:
        return
    m = max(1, -(-max(ctx) // bs))
    num_blocks = len(ctx) * m
    cache = torch.randint(0, 256, (num_blocks, bs, RECORD_BYTES), dtype=torch.uint8, generator=gen)
    table = torch.randperm(num_blocks, generator=gen).reshape(len(ctx), m).to(torch.int32)
    starts, _, cu, tot = c.tensors()
    got: list[list[torch.Tensor]] = [[] for _ in ctx]
    for i, rows in enumerate(chunked_context_rows(context_lens=ctx, chunked=c)):
        ws = gather(
            src_cache=cache,
            block_table=table,
            workspace_starts=cu[i],
            batch_size=len(ctx),
            seq_starts=starts[i],
            total=int(tot[i]),
        )
        for row, (r, _) in zip(ws, rows):
            got[r].append(row)
    for r, n in enumerate(ctx):
        slots = [(int(table[r, p // bs]), p % bs) for p in range(n)]
        want = dequant_records(torch.stack([cache[b, o] for b, o in slots])) if n else None
        if n:
            assert torch.equal(torch.stack(got[r]).view(torch.int16), want.view(torch.int16))
        else:
            assert got[r] == []
