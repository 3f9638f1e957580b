"""The convert's arguments from vLLM's releases (SPEC 10): ``idx_mapping`` (0.33.0) and the DCP
arguments of the plain convert (0.30.0), in the oracle: loop and vectorized agree, each worked by
hand, and at their defaults nothing changes."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.tests.oracles.test_convert import convert_cases, i32
from mlafuzz.tests.oracles.test_convert_options import both

FAST = settings(max_examples=60, deadline=None)

ROWS = dict(
    req_id=i32([0, 1]),
    block_table=i32([[3, 1], [0, 2]]),
    token_indices=i32([[5, -1, 2, 8, -3, 4], [7, 0, 9, 3, 1, -1]]),
    block_size=4,
)


def test_idx_mapping_picks_each_requests_table_row_and_a_negative_entry_reads_row_0() -> None:
    plain, _ = both(**ROWS)
    swapped, _ = both(**ROWS, idx_mapping=i32([1, 0]))
    assert swapped.tolist() == both(**{**ROWS, "req_id": i32([1, 0])})[0].tolist() != plain.tolist()
    negative, _ = both(**ROWS, idx_mapping=i32([-5, -1]))  # both requests read row 0
    assert negative.tolist() == both(**{**ROWS, "req_id": i32([0, 0])})[0].tolist()


def test_a_request_outside_the_mapping_is_an_undefined_row_of_minus_ones() -> None:
    out, counts = both(**ROWS, idx_mapping=i32([0]))  # request 1 has no entry
    assert out[1].tolist() == [-1] * 6 and counts.tolist()[1] == 0


def test_dcp_keeps_this_ranks_decode_tokens_at_their_local_slots_by_hand() -> None:
    # D = 2, I = 1: even tokens are rank 0's at t // 2, odd ones rank 1's.
    out, counts = both(**ROWS, dcp_size=2, dcp_rank=1)
    # row 0 (table [3, 1]): 5 -> local 2 -> 3*4+2; 8, 2, 4: rank 0's
    # row 1 (table [0, 2]): 7 -> local 3 -> 0*4+3; 9 -> local 4 -> 2*4+0; 3 -> 1; 1 -> 0
    assert out.tolist() == [[14, -1, -1, -1, -1, -1], [3, -1, 8, 1, 0, -1]]
    assert counts.tolist() == [1, 4]


def test_a_prefill_token_of_any_rank_is_valid_in_the_rank_major_workspace_by_hand() -> None:
    rows = dict(
        **ROWS,
        has_prefill_workspace=True,
        prefill_workspace_request_ids=i32([0, -1]),
        prefill_workspace_starts=i32([100]),
    )
    out, _ = both(**rows, dcp_size=2, dcp_rank=0, dcp_interleave=2, prefill_rank_stride=1000)
    # I = 2: groups of 2 alternate ranks; t -> owner (t // 2) % 2, local (t // 4) * 2 + t % 2.
    # row 0 (prefill): 5 -> owner 0, local 3 -> 103; 2 -> owner 1, local 0 -> 1100; 8 -> owner 0,
    # local 4 -> blk 1 < M -> 104; 4 -> owner 0, local 2 -> 102.
    assert out[0].tolist() == [103, -1, 1100, 104, -1, 102]
    # row 1 (decode, rank 0): 7 owner 1; 0 -> 0*4+0; 9 -> owner 0, local 5 -> 2*4+1; 3 owner 1; 1 -> 1
    assert out[1].tolist() == [-1, 0, 9, -1, 1, -1]


def test_a_prefill_token_whose_local_block_is_past_the_table_is_invalid() -> None:
    rows = dict(
        req_id=i32([0]),
        block_table=i32([[0]]),
        token_indices=i32([[3, 4, 9]]),
        block_size=4,
        has_prefill_workspace=True,
        prefill_workspace_request_ids=i32([0]),
        prefill_workspace_starts=i32([10]),
    )
    out, _ = both(**rows, dcp_size=2, prefill_rank_stride=50)
    # 3 -> owner 1, local 1 -> 50 + 10 + 1; 4 -> owner 0, local 2 -> 12; 9 -> local 4: blk 1 >= M
    assert out.tolist() == [[61, 12, -1]]


@st.composite
def release_cases(draw: st.DrawFn) -> dict[str, object]:
    case = draw(convert_cases())
    n_req = case["block_table"].shape[0]
    if draw(st.booleans()):
        case["idx_mapping"] = i32(draw(st.lists(st.integers(-2, n_req), max_size=5)))
    size = draw(st.integers(1, 4))
    case.update(
        dcp_size=size,
        dcp_rank=draw(st.integers(0, size - 1)),
        dcp_interleave=draw(st.sampled_from([1, 2, 3, 64])),
        prefill_rank_stride=draw(st.one_of(st.just(0), st.integers(0, 1 << 31))),
    )
    return case


@FAST
@given(release_cases())
def test_loop_and_vectorized_agree_with_the_releases_arguments(case: dict[str, object]) -> None:
    both(**case)


@FAST
@given(convert_cases())
def test_the_releases_arguments_at_their_defaults_change_nothing(case: dict[str, object]) -> None:
    plain = both(**case)
    spelled = both(**case, dcp_size=1, dcp_rank=0, dcp_interleave=1, prefill_rank_stride=12345)
    assert all(torch.equal(a, b) for a, b in zip(plain, spelled))
