"""convert's later options (SPEC.md sections 3 and 7): block_stride_rows,
compact_to_front, and the set comparison of compacted rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.oracles.convert import convert, convert_loop, rows_as_sets_equal
from mlafuzz.tests.oracles.test_convert import convert_cases, i32

FAST = settings(max_examples=60, deadline=None)


def both(**kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    a_out, a_cnt = convert(**kw)  # type: ignore[arg-type]
    b_out, b_cnt = convert_loop(**kw)  # type: ignore[arg-type]
    assert torch.equal(a_out, b_out) and torch.equal(a_cnt, b_cnt)
    assert a_out.dtype == torch.int32 and a_cnt.dtype == torch.int32
    return a_out, a_cnt


ROWS = dict(
    req_id=i32([0, 1]),
    block_table=i32([[3, 1], [0, 2]]),
    token_indices=i32([[5, -1, 2, 8, -3, 4], [7, 0, 9, 3, 1, -1]]),
    block_size=4,
)


# ------------------------------------------------------------------ block stride


def test_block_stride_rows_multiplies_the_block_id_by_the_stride_by_hand() -> None:
    out, cnt = both(**ROWS, block_stride_rows=10)
    # row 0: 5 -> blk 1 -> 1*10+1; 2 -> 3*10+2; 8 -> blk 2 >= M; 4 -> blk 1 -> 1*10+0
    # row 1: 7 -> 2*10+3; 0 -> 0*10+0; 9 -> blk 2 >= M; 3 -> 0+3; 1 -> 0+1
    assert out.tolist() == [[11, -1, 32, -1, -1, 10], [23, 0, -1, 3, 1, -1]]
    assert cnt.tolist() == [3, 4]


def test_block_stride_none_is_block_size() -> None:
    assert torch.equal(both(**ROWS)[0], both(**ROWS, block_stride_rows=4)[0])
    assert both(**ROWS)[0].tolist() == [[5, -1, 14, -1, -1, 4], [11, 0, -1, 3, 1, -1]]


def test_block_stride_keeps_the_bounds_on_block_size_and_leaves_prefill_rows_alone() -> None:
    out, cnt = both(
        req_id=i32([0, 0]),
        block_table=i32([[2, 5]]),
        token_indices=i32([[7, 8, 100], [7, 8, 3]]),  # 8 // 4 = 2 >= M = 2: invalid however big the stride
        block_size=4,
        block_stride_rows=1000,
        has_prefill_workspace=True,
        prefill_workspace_request_ids=i32([-1, 0]),
        prefill_workspace_starts=i32([40]),
    )
    assert out.tolist() == [[5003, -1, -1], [47, -1, 43]] and cnt.tolist() == [1, 2]


def test_block_stride_product_wraps_to_int32() -> None:
    out, cnt = both(
        req_id=i32([0]),
        block_table=i32([[2**20, 2**19 + 1]]),
        token_indices=i32([[3, 4]]),
        block_size=4,
        block_stride_rows=2**12,
    )
    # 2**20 * 2**12 + 3 = 2**32 + 3 -> 3; (2**19 + 1) * 2**12 + 0 = 2**31 + 4096 -> -2**31 + 4096
    assert out.tolist() == [[3, -(2**31) + 4096]] and cnt.tolist() == [2]


@pytest.mark.parametrize("bad", [0, -4, 2.0, True])
def test_block_stride_must_be_a_positive_int(bad: object) -> None:
    for fn in (convert, convert_loop):
        with pytest.raises(ValueError, match="block_stride_rows"):
            fn(**ROWS, block_stride_rows=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ compact to front


def test_compact_packs_valid_values_in_column_order_then_minus_one() -> None:
    out, cnt = both(**ROWS, block_stride_rows=10, compact_to_front=True)
    assert out.tolist() == [[11, 32, 10, -1, -1, -1], [23, 0, 3, 1, -1, -1]]
    assert cnt.tolist() == [3, 4]


def test_compact_keeps_a_valid_value_that_wrapped_to_minus_one() -> None:
    # (2**30 - 1) * 4 + 3 = 2**32 - 1 wraps to -1 but is valid; (2**30 - 1) * 4 + 1 wraps to -3
    out, cnt = both(
        req_id=i32([0]),
        block_table=i32([[2**30 - 1]]),
        token_indices=i32([[-1, 3, -5, 1]]),
        block_size=4,
        compact_to_front=True,
    )
    assert out.tolist() == [[-1, -3, -1, -1]] and cnt.tolist() == [2]


def test_compact_undefined_and_empty_rows() -> None:
    out, cnt = both(
        req_id=i32([5, 0]),
        block_table=i32([[1]]),
        token_indices=i32([[0, 1], [-1, -1]]),
        block_size=2,
        compact_to_front=True,
    )
    assert out.tolist() == [[-1, -1], [-1, -1]] and cnt.tolist() == [0, 0]
    out, cnt = both(
        req_id=i32([]), block_table=i32([[1]]), token_indices=i32([]).reshape(0, 4), block_size=2, compact_to_front=True
    )
    assert out.shape == (0, 4) and cnt.shape == (0,)


@FAST
@given(convert_cases(), st.one_of(st.none(), st.integers(1, 2**13)), st.booleans())
def test_loop_and_vectorized_agree_with_both_options(
    case: dict[str, object], stride: int | None, compact: bool
) -> None:
    out, cnt = both(**case, block_stride_rows=stride, compact_to_front=compact)
    if compact:
        plain, plain_cnt = both(**case, block_stride_rows=stride)
        assert torch.equal(cnt, plain_cnt)
        assert bool(rows_as_sets_equal(expected=out, actual=out, counts=cnt).all())
        for row, prow, c in zip(out.tolist(), plain.tolist(), cnt.tolist()):
            assert row[c:] == [-1] * (len(row) - c)
            # same values as the in-place row, without its -1s (only a wrapped value can be -1 and valid)
            assert sorted(v for v in row[:c] if v != -1) == sorted(v for v in prow if v != -1)


# ------------------------------------------------------------------ rows_as_sets_equal


def test_sets_equal_accepts_any_order_of_the_prefix_and_requires_the_minus_one_tail() -> None:
    exp = i32([[11, 32, 10, -1, -1], [23, 0, 3, 1, -1], [-1, -1, -1, -1, -1]])
    cnt = i32([3, 4, 0])
    assert (
        rows_as_sets_equal(
            expected=exp, actual=i32([[10, 11, 32, -1, -1], [1, 3, 0, 23, -1], [-1] * 5]), counts=cnt
        ).tolist()
        == [True] * 3
    )
    bad = i32(
        [
            [10, 11, 33, -1, -1],  # a wrong value
            [1, 3, 0, -1, 23],  # a value in the tail, a -1 in the prefix
            [-1, -1, -1, -1, 0],
        ]
    )  # garbage past an empty prefix
    assert rows_as_sets_equal(expected=exp, actual=bad, counts=cnt).tolist() == [False] * 3


def test_sets_equal_is_a_multiset_comparison() -> None:
    exp, cnt = i32([[5, 5, 7, -1]]), i32([3])
    assert not bool(rows_as_sets_equal(expected=exp, actual=i32([[5, 7, 7, -1]]), counts=cnt)[0])
    assert bool(rows_as_sets_equal(expected=exp, actual=i32([[7, 5, 5, -1]]), counts=cnt)[0])


def test_sets_equal_takes_mixed_int_dtypes_and_checks_shapes() -> None:
    exp, cnt = i32([[1, 2, -1]]), torch.tensor([2])
    assert bool(rows_as_sets_equal(expected=exp, actual=torch.tensor([[2, 1, -1]]), counts=cnt)[0])
    with pytest.raises(ValueError, match="shape"):
        rows_as_sets_equal(expected=exp, actual=i32([[2, 1]]), counts=cnt)
    with pytest.raises(ValueError, match="counts.shape"):
        rows_as_sets_equal(expected=exp, actual=exp, counts=i32([1, 1]))


@FAST
@given(st.integers(0, 2**31), st.integers(0, 6), st.sampled_from([1, 4, 16]))
def test_sets_equal_holds_for_every_permutation_of_the_oracles_prefix(seed: int, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    toks = torch.randint(-3, 12, (n, k), generator=gen, dtype=torch.int32)
    table = torch.randint(0, 9, (2, 3), generator=gen, dtype=torch.int32)
    req = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int32)
    exp, cnt = convert(req_id=req, block_table=table, token_indices=toks, block_size=4, compact_to_front=True)
    act = exp.clone()
    for i, c in enumerate(cnt.tolist()):
        act[i, :c] = act[i, :c][torch.randperm(c, generator=gen)]
    assert bool(rows_as_sets_equal(expected=exp, actual=act, counts=cnt).all())
