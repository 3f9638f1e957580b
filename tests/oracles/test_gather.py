"""Tests for mlafuzz.oracles.gather (SPEC.md section 4)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.oracles.codec import RECORD_BYTES, dequant_records, encode_rows
from mlafuzz.oracles.gather import PRECONDITION_CLASSES, gather, gather_loop, gather_preconditions

FAST = settings(max_examples=40, deadline=None)


def i32(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32)


def bits16(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def make_cache(seed: int, num_blocks: int, bs: int) -> torch.Tensor:
    """Realistic records (the writer's) with every fifth one random bytes."""
    gen = torch.Generator().manual_seed(seed)
    n = num_blocks * bs
    kv = (torch.randn(n, 512, generator=gen) * 3).to(torch.bfloat16)
    pe = torch.randn(n, 64, generator=gen).to(torch.bfloat16)
    rec = encode_rows(kv_c=kv, k_pe=pe)
    noise = torch.randint(0, 256, rec.shape, dtype=torch.uint8, generator=gen)
    rec[::5] = noise[::5]
    return rec.reshape(num_blocks, bs, RECORD_BYTES)


def both(**kw: object) -> torch.Tensor:
    a = gather(**kw)  # type: ignore[arg-type]
    b = gather_loop(**kw)  # type: ignore[arg-type]
    assert a.dtype == torch.bfloat16 and a.shape == (kw["total"], 576)
    assert torch.equal(bits16(a), bits16(b))
    return a


def by_definition(
    cache: torch.Tensor, table: list[list[int]], ws: list[int], ss: list[int], total: int
) -> torch.Tensor:
    """SPEC 4 written out directly, reusing only the (separately tested) dequant."""
    bs = cache.shape[1]
    rows = []
    for b in range(len(ws)):
        end = ws[b + 1] if b + 1 < len(ws) else total
        for j in range(end - ws[b]):
            p = ss[b] + j
            rows.append(cache[table[b][p // bs], p % bs])
    return dequant_records(torch.stack(rows)) if rows else torch.empty(0, 576, dtype=torch.bfloat16)


@st.composite
def gather_cases(draw: st.DrawFn) -> dict[str, object]:
    bs = draw(st.sampled_from([1, 2, 3, 4, 5]))
    num_blocks = draw(st.integers(1, 5))
    b = draw(st.integers(1, 3))
    lens = draw(st.lists(st.integers(0, 4), min_size=b, max_size=b))
    ss = draw(st.lists(st.integers(0, 6), min_size=b, max_size=b))
    m = max((s + ln + bs - 1) // bs for s, ln in zip(ss, lens)) + draw(st.integers(0, 1))
    m = max(m, 1)
    # Small num_blocks forces shared physical blocks across requests.
    table = draw(
        st.lists(
            st.lists(st.integers(0, num_blocks - 1), min_size=m, max_size=m),
            min_size=b + draw(st.integers(0, 1)),
            max_size=b + 1,
        )
    )
    ws = [0]
    for ln in lens[:-1]:
        ws.append(ws[-1] + ln)
    total = ws[-1] + lens[-1]
    if draw(st.booleans()):  # the cumulative [B+1] form; its last entry is ignored
        ws = ws + [draw(st.integers(-5, 99))]
    return dict(
        src_cache=make_cache(draw(st.integers(0, 2**20)), num_blocks, bs),
        block_table=i32(table),
        workspace_starts=i32(ws),
        batch_size=b,
        seq_starts=i32(ss) if draw(st.booleans()) or any(ss) else None,
        total=total,
        _table=table,
        _ws=ws[:b],
        _ss=ss,
    )


@FAST
@given(gather_cases())
def test_loop_vectorized_and_definition_agree(case: dict[str, object]) -> None:
    table, ws, ss = case.pop("_table"), case.pop("_ws"), case.pop("_ss")
    if case["seq_starts"] is None:
        ss = [0] * case["batch_size"]
    assert gather_preconditions(**case) == []
    out = both(**case)
    ref = by_definition(case["src_cache"], table, ws, ss, case["total"])
    assert torch.equal(bits16(out), bits16(ref))


def test_seq_starts_shift_each_request_and_none_means_zeros() -> None:
    cache = make_cache(0, 4, 2)
    kw = dict(
        src_cache=cache, block_table=i32([[0, 1, 2], [3, 0, 1]]), workspace_starts=i32([0, 2]), batch_size=2, total=5
    )
    base = both(**kw, seq_starts=None)
    assert torch.equal(bits16(base), bits16(both(**kw, seq_starts=i32([0, 0]))))
    shifted = both(**kw, seq_starts=i32([3, 1]))
    # request 0 positions 3,4 -> blocks 1,2 offset 1,0; request 1 positions 1..3
    ref = dequant_records(torch.stack([cache[1, 1], cache[2, 0], cache[3, 1], cache[0, 0], cache[0, 1]]))
    assert torch.equal(bits16(shifted), bits16(ref))
    assert not torch.equal(bits16(shifted), bits16(base))  # the re-read bug would pass base


def test_empty_requests_and_total_zero() -> None:
    cache = make_cache(1, 2, 3)
    out = both(
        src_cache=cache,
        block_table=i32([[1, 0]] * 4),
        workspace_starts=i32([0, 0, 2, 2]),
        batch_size=4,
        seq_starts=i32([9, 1, 0, 0]),
        total=3,
    )
    # request 1 reads positions 1, 2 of block 1; request 3 position 0 of block 1
    ref = dequant_records(torch.stack([cache[1, 1], cache[1, 2], cache[1, 0]]))
    assert torch.equal(bits16(out), bits16(ref))
    empty = both(
        src_cache=cache, block_table=i32([[0]]), workspace_starts=i32([0]), batch_size=1, seq_starts=None, total=0
    )
    assert empty.shape == (0, 576)


def test_block_size_one_and_three_and_fp8_view() -> None:
    for bs in (1, 3):
        cache = make_cache(2, 4, bs)
        kw = dict(
            block_table=i32([[3, 2, 1, 0]]), workspace_starts=i32([0, 7]), batch_size=1, seq_starts=i32([1]), total=3
        )
        a = both(src_cache=cache, **kw)
        b = both(src_cache=cache.view(torch.float8_e4m3fn), **kw)
        assert torch.equal(bits16(a), bits16(b))


def bad_case(**over: object) -> dict[str, object]:
    kw: dict[str, object] = dict(
        src_cache=make_cache(3, 2, 2),
        block_table=i32([[0, 1], [1, 0]]),
        workspace_starts=i32([0, 2]),
        batch_size=2,
        seq_starts=None,
        total=4,
    )
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (dict(workspace_starts=i32([1, 2])), ["ws0_nonzero"]),
        (dict(batch_size=0, total=1), ["ws0_nonzero"]),
        (
            dict(workspace_starts=i32([0, 3, 1]), batch_size=3, block_table=i32([[0, 1]] * 3), total=4),
            ["ws_decreasing"],
        ),
        (dict(workspace_starts=i32([0, 1]), total=0), ["ws_past_total"]),
        (dict(seq_starts=i32([3, 0])), ["block_index_past_table"]),
        (dict(block_table=i32([[0, 1], [2, 0]])), ["block_id_past_cache"]),
        (dict(block_table=i32([[-1, 0], [1, 0]])), ["block_id_past_cache"]),
        (dict(seq_starts=i32([-1, 0])), ["negative_seq_start"]),
    ],
)
def test_each_precondition_class_is_detected_and_rejected(override: dict, expected: list[str]) -> None:
    kw = bad_case(**override)
    assert gather_preconditions(**kw) == expected
    assert set(expected) <= set(PRECONDITION_CLASSES)
    for fn in (gather, gather_loop):
        with pytest.raises(ValueError, match=expected[0]):
            fn(**kw)


def test_empty_request_reads_nothing_so_its_table_row_is_not_checked() -> None:
    kw = bad_case(workspace_starts=i32([0, 4]), block_table=i32([[0, 1], [99, -5]]), seq_starts=i32([0, -3]))
    assert gather_preconditions(**kw) == []
    both(**kw)


def test_malformed_arguments_raise() -> None:
    with pytest.raises(ValueError, match="workspace_starts"):
        gather(**bad_case(workspace_starts=i32([0])))
    with pytest.raises(ValueError, match="block_table"):
        gather(**bad_case(block_table=i32([[0, 1]])))
    with pytest.raises(ValueError, match="src_cache"):
        gather(**bad_case(src_cache=torch.zeros(2, 2, 600, dtype=torch.uint8)))
