"""The nvfp4_ds_mla gathers over the paged cache (oracles/formats/nvfp4_gather.py): SPEC 4's
addressing with the 352-byte record and either reader."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mlafuzz.oracles.formats.nvfp4_gather import gather, gather_fp8, gather_fp8_loop, gather_loop, gather_preconditions
from mlafuzz.oracles.formats.nvfp4_read import dequant, stage_fp8
from mlafuzz.oracles.formats.nvfp4_write import encode_rows


def i32(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32)


def cache(num_blocks: int, bs: int, seed: int) -> torch.Tensor:
    """Writer records, every third one random bytes (NaN and negative scales included)."""
    gen = torch.Generator().manual_seed(seed)
    n = num_blocks * bs
    kv = (torch.randn(n, 512, generator=gen) * 4).to(torch.bfloat16)
    pe = (torch.randn(n, 64, generator=gen) * 100).to(torch.bfloat16)
    rec = encode_rows(kv_c=kv, k_pe=pe)
    rec[::3] = torch.randint(0, 256, rec[::3].shape, dtype=torch.uint8, generator=gen)
    return rec.reshape(num_blocks, bs, 352)


CASES = [
    # (block_table, workspace_starts, seq_starts, total): two requests sharing block 2, a
    # continuation chunk (seq_starts), an empty request, a [B+1] cumulative ws, total 0
    ([[3, 2, 0], [2, 1, 4]], [0, 5], [1, 0], 9),
    ([[4, 0, 1], [1, 1, 3], [0, 2, 2]], [0, 0, 6], [2, 3, 0], 8),
    ([[1, 2, 3]], [0, 4], None, 6),
    ([[0, 1]], [0], [0], 0),
]


@pytest.mark.parametrize("table, ws, ss, total", CASES)
def test_each_dst_row_is_the_record_at_its_requests_position_under_both_readers(
    table: list[list[int]], ws: list[int], ss: list[int] | None, total: int
) -> None:
    src = cache(5, 3, seed=total)
    call = dict(
        src_cache=src,
        block_table=i32(table),
        workspace_starts=i32(ws),
        batch_size=len(table),
        seq_starts=None if ss is None else i32(ss),
        total=total,
    )
    assert gather_preconditions(**call) == []
    bs, starts = 3, ss or [0] * len(table)
    records = []
    for b in range(len(table)):
        end = ws[b + 1] if b + 1 < len(table) else total
        for j in range(end - ws[b]):
            p = starts[b] + j
            records.append(src[table[b][p // bs], p % bs])
    want = torch.stack(records) if records else torch.empty(0, 352, dtype=torch.uint8)
    got = gather(**call)
    assert got.shape == (total, 576) and torch.equal(got.view(torch.int16), gather_loop(**call).view(torch.int16))
    assert torch.equal(got.view(torch.int16), dequant(want).view(torch.int16))
    for inv in (1.0, 0.3):
        staged = gather_fp8(inv_scale=inv, **call)
        assert torch.equal(staged, gather_fp8_loop(inv_scale=inv, **call)) and torch.equal(
            staged, stage_fp8(want, inv_scale=inv)
        )


def test_a_call_outside_the_preconditions_names_its_classes_and_defines_nothing() -> None:
    src = cache(2, 4, seed=1)
    bad = dict(
        src_cache=src,
        block_table=i32([[0, 1], [1, 5]]),
        workspace_starts=i32([1, 3]),
        batch_size=2,
        seq_starts=i32([0, 6]),
        total=6,
    )
    assert gather_preconditions(**bad) == ["ws0_nonzero", "block_index_past_table", "block_id_past_cache"]
    for fn in (gather, gather_loop):
        with pytest.raises(ValueError, match="ws0_nonzero"):
            fn(**bad)
    with pytest.raises(ValueError, match="last dim must be 352"):
        gather(**{**bad, "src_cache": torch.zeros(2, 4, 656, dtype=torch.uint8)})


@st.composite
def calls(draw: st.DrawFn) -> dict[str, object]:
    """Valid calls: up to 3 requests over few blocks (shared ones), any seq_starts, either ws form."""
    bs, num_blocks, b = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    lens = draw(st.lists(st.integers(0, 4), min_size=b, max_size=b))
    ss = draw(st.lists(st.integers(0, 5), min_size=b, max_size=b))
    m = max(1, max((s + n + bs - 1) // bs for s, n in zip(ss, lens)))
    row = st.lists(st.integers(0, num_blocks - 1), min_size=m, max_size=m)
    table = draw(st.lists(row, min_size=b, max_size=b + 1))
    ws = [sum(lens[:k]) for k in range(b)]
    if draw(st.booleans()):
        ws.append(draw(st.integers(-3, 50)))  # the cumulative [B+1] form: its last entry is ignored
    return dict(
        src_cache=cache(num_blocks, bs, seed=draw(st.integers(0, 2**16))),
        block_table=i32(table),
        workspace_starts=i32(ws),
        batch_size=b,
        seq_starts=i32(ss) if any(ss) or draw(st.booleans()) else None,
        total=sum(lens),
    )


@given(calls())
def test_loop_and_vectorized_gathers_agree_on_drawn_calls(call: dict[str, object]) -> None:
    assert gather_preconditions(**call) == []
    assert torch.equal(gather(**call).view(torch.int16), gather_loop(**call).view(torch.int16))
    assert torch.equal(gather_fp8(inv_scale=0.75, **call), gather_fp8_loop(inv_scale=0.75, **call))
