"""Tests for mlafuzz.oracles.convert (SPEC.md section 3)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.oracles.convert import convert, convert_loop, convert_undefined_rows, wrap_int32

FAST = settings(max_examples=60, deadline=None)


def i32(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32)


def both(**kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    a_out, a_cnt = convert(**kw)  # type: ignore[arg-type]
    b_out, b_cnt = convert_loop(**kw)  # type: ignore[arg-type]
    assert torch.equal(a_out, b_out) and torch.equal(a_cnt, b_cnt)
    assert a_out.dtype == torch.int32 and a_cnt.dtype == torch.int32
    return a_out, a_cnt


def test_hand_worked_decode_rows() -> None:
    out, cnt = both(
        req_id=i32([0, 1]),
        block_table=i32([[5, 2], [7, 1]]),
        token_indices=i32([[0, 5, -1, 8, -7, 3], [4, 7, 1, 9, -2, 0]]),
        block_size=4,
    )
    # row 0: 0 -> 5*4+0; 5 -> blk 1 -> 2*4+1; 8 -> blk 2 past M=2; 3 -> 5*4+3
    assert out.tolist() == [[20, 9, -1, -1, -1, 23], [4, 7, 29, -1, -1, 28]]
    assert cnt.tolist() == [3, 4]


def test_prefill_rows_use_workspace_offsets_and_still_check_the_block_range() -> None:
    out, cnt = both(
        req_id=i32([0, 99, 0]),  # the prefill row's req is never read
        block_table=i32([[3, 4]]),
        token_indices=i32([[1, 2, 5, -1], [1, 2, 5, -1], [0, 7, 8, 3]]),
        block_size=4,
        has_prefill_workspace=True,
        prefill_workspace_request_ids=i32([-1, 1, 0]),
        prefill_workspace_starts=i32([100, 40]),
    )
    assert out.tolist() == [[13, 14, 17, -1], [41, 42, 45, -1], [100, 107, -1, 103]]
    assert cnt.tolist() == [3, 3, 3]


def test_every_negative_token_is_invalid_not_only_minus_one() -> None:
    out, cnt = both(
        req_id=i32([0]), block_table=i32([[1]]), token_indices=i32([[-1, -2, -64, -(2**31), 0]]), block_size=64
    )
    assert out.tolist() == [[-1, -1, -1, -1, 64]] and cnt.tolist() == [1]


def test_values_wrap_to_int32_like_the_kernel() -> None:
    out, cnt = both(req_id=i32([0]), block_table=i32([[2**30, -3]]), token_indices=i32([[1, 5]]), block_size=4)
    assert out.tolist() == [[wrap_int32(2**32 + 1), -11]] == [[1, -11]]
    assert cnt.tolist() == [2]  # validity is about inputs, not about the value's sign


def test_rows_with_req_out_of_range_are_reported_and_returned_as_minus_one() -> None:
    kw = dict(
        req_id=i32([2, -1, 1]), block_table=i32([[1], [2]]), token_indices=i32([[0, 1], [0, 1], [0, 1]]), block_size=2
    )
    out, cnt = both(**kw)
    assert out.tolist() == [[-1, -1], [-1, -1], [4, 5]] and cnt.tolist() == [0, 0, 2]
    mask = convert_undefined_rows(req_id=kw["req_id"], block_table=kw["block_table"])
    assert mask.tolist() == [True, True, False]


def test_prefill_id_past_workspace_starts_is_an_undefined_row() -> None:
    kw = dict(
        req_id=i32([0, 0]),
        block_table=i32([[1]]),
        token_indices=i32([[0], [0]]),
        block_size=2,
        has_prefill_workspace=True,
        prefill_workspace_request_ids=i32([0, 1]),
        prefill_workspace_starts=i32([7]),
    )
    out, cnt = both(**kw)
    assert out.tolist() == [[7], [-1]] and cnt.tolist() == [1, 0]


def test_shape_mismatch_and_missing_prefill_arrays_raise() -> None:
    with pytest.raises(ValueError, match="req_id.shape"):
        convert(req_id=i32([0, 0]), block_table=i32([[0]]), token_indices=i32([[0]]), block_size=1)
    with pytest.raises(ValueError, match="has_prefill_workspace"):
        convert_loop(
            req_id=i32([0]), block_table=i32([[0]]), token_indices=i32([[0]]), block_size=1, has_prefill_workspace=True
        )
    with pytest.raises(ValueError, match="block_size"):
        convert(req_id=i32([0]), block_table=i32([[0]]), token_indices=i32([[0]]), block_size=0)


@st.composite
def convert_cases(draw: st.DrawFn) -> dict[str, object]:
    n = draw(st.integers(0, 5))
    k = draw(st.sampled_from([1, 2, 4, 8]))
    n_req = draw(st.integers(0, 4))
    m = draw(st.integers(0, 4))
    bs = draw(st.sampled_from([1, 2, 3, 4, 64]))
    big = st.integers(-(2**31), 2**31 - 1)
    table_vals = st.one_of(st.integers(-2, 20), big)
    table = draw(st.lists(st.lists(table_vals, min_size=m, max_size=m), min_size=n_req, max_size=n_req))
    toks = draw(
        st.lists(st.lists(st.one_of(st.integers(-3, m * bs + 3), big), min_size=k, max_size=k), min_size=n, max_size=n)
    )
    reqs = draw(st.lists(st.integers(-1, n_req), min_size=n, max_size=n))
    case: dict[str, object] = dict(
        req_id=i32(reqs).reshape(n),
        block_table=i32(table).reshape(n_req, m),
        token_indices=i32(toks).reshape(n, k),
        block_size=bs,
    )
    if draw(st.booleans()):
        n_pre = draw(st.integers(0, 3))
        case.update(
            has_prefill_workspace=True,
            prefill_workspace_request_ids=i32(draw(st.lists(st.integers(-1, n_pre), min_size=n, max_size=n))).reshape(
                n
            ),
            prefill_workspace_starts=i32(
                draw(st.lists(st.one_of(st.integers(0, 50), big), min_size=n_pre, max_size=n_pre))
            ).reshape(n_pre),
        )
    return case


@FAST
@given(convert_cases())
def test_loop_and_vectorized_agree_bit_for_bit(case: dict[str, object]) -> None:
    out, cnt = both(**case)
    tok = case["token_indices"]
    assert bool((out[tok < 0] == -1).all())  # negatives are always invalid
    assert bool((cnt <= tok.shape[1]).all()) and bool((cnt >= 0).all())
