"""Tests for mlafuzz.generators.rng.fill: vectorized device-exact block tables, top-k rows, writer
inputs and slot mappings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mlafuzz.generators import catalog
from mlafuzz.generators.ops.writer import WriterValues
from mlafuzz.generators.rng import fill, topk
from mlafuzz.generators.rng.bits import BF16, FP16, half_bits, to_half
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.spec import TopkMode

CPU = "cpu"
D = Draws(2026, "test-fill")


# --- bit helpers -------------------------------------------------------------


def test_half_bits_saturates_and_goes_subnormal() -> None:
    sign = torch.tensor([0, 1, 0, 0, 0])
    exp = torch.tensor([0, 40, -14, -20, -40])
    mant = torch.tensor([0, 0x3FF, 0, 0x200, 0x3FF])
    got = to_half(half_bits(sign, exp, mant, FP16), torch.float16).float().tolist()
    assert got == [1.0, -65504.0, 2.0**-14, 1.5 * 2.0**-20, 0.0]
    assert to_half(half_bits(sign[:1], torch.tensor([-126]), mant[:1], BF16), torch.bfloat16).item() == 2.0**-126


# --- block tables --------------------------------------------------------------


def _table(*, need, **kw):
    """(table, pool) as a materializer makes them: the plan, its rows on the device, the table."""
    plan = fill.plan_table(need=need, **kw)
    (rows,) = fill.upload(plan.rows, device=CPU)
    return fill.block_table(D, plan, rows=rows, device=CPU), plan.pool


@pytest.mark.parametrize("need", [[3, 5, 2], [1], [0, 4], [7, 7, 7, 7], [0, 0]])
def test_a_contiguous_table_numbers_each_requests_blocks_in_turn(need: list[int]) -> None:
    table, pool = _table(need=need, layout="contiguous", spare_blocks=2, extra_cols=1)
    assert table.dtype == torch.int32 and table.shape == (len(need), max(max(need) + 1, 1))
    assert pool == max(sum(need) + 2, 1)
    at = 0
    for r, n in enumerate(need):
        assert table[r, :n].tolist() == list(range(at, at + n)) and not table[r, n:].any()
        at += n


@pytest.mark.parametrize("layout", ["shuffled", "shared_prefix"])
@pytest.mark.parametrize("base", [0, 40_000_000])
def test_random_tables_have_distinct_ids_except_the_shared_prefix(layout: str, base: int) -> None:
    need = [6, 9, 4, 12, 4]
    table, pool = _table(need=need, layout=layout, spare_blocks=3, extra_cols=2, base_block=base)
    shared = 2 if layout == "shared_prefix" else 0
    assert pool == shared + sum(n - shared for n in need) + 3 and table.shape == (5, 14)
    rows = [table[r, :n].tolist() for r, n in enumerate(need)]
    assert all(not table[r, n:].any() for r, n in enumerate(need))
    for row in rows:
        assert len(set(row)) == len(row) and all(base <= b < base + pool for b in row)
        assert row[:shared] == rows[0][:shared]
    owned = [b for row in rows for b in row[shared:]]
    assert len(set(owned)) == len(owned) and not set(owned) & set(rows[0][:shared])
    assert rows[0] != sorted(rows[0]) or rows[1] != sorted(rows[1])  # shuffled, not arange


def test_upload_sends_every_part_in_one_tensor() -> None:
    a, b, c = fill.upload([(1, 2), (3, 4), (5, 6)], [7, 8], [], device=CPU)
    assert a.tolist() == [[1, 2], [3, 4], [5, 6]] and b.tolist() == [7, 8] and c.numel() == 0
    assert a.dtype == torch.int32 and a.is_contiguous() and b.is_contiguous()
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_upload_of_one_part_keeps_its_shape() -> None:
    (rows,) = fill.upload(np.array([[1, -2, 3], [4, 5, 2**31 - 1]]), device=CPU)
    (flat,) = fill.upload([9, 8], device=CPU)
    assert rows.tolist() == [[1, -2, 3], [4, 5, 2**31 - 1]] and rows.dtype == torch.int32 and rows.is_contiguous()
    assert flat.tolist() == [9, 8]
    with pytest.raises(ValueError, match="does not fit int32"):
        fill.upload(np.array([[0, 2**31]]), device=CPU)


def test_only_live_columns_own_blocks_and_the_others_hold_pool_ids() -> None:
    need, live = [10, 6, 8], [(2, 4), (1, 0), (0, 7)]  # request 1 reads nothing
    table, pool = _table(need=need, layout="shuffled", live=live, base_block=100)
    assert pool == 3 + 0 + 8
    owned = table[0, 2:5].tolist() + table[2, :8].tolist()
    assert sorted(owned) == list(range(100, 111))  # the pool is exactly the live blocks
    cold = table[0, [0, 1, 5, 6, 7, 8, 9]].tolist() + table[1, :6].tolist()
    assert all(100 <= b < 111 for b in cold) and not table[1, 6:].any()


def test_block_ids_can_sit_at_the_top_of_int32() -> None:
    pool = 8
    table, n = _table(need=[8], layout="shuffled", base_block=(1 << 31) - pool)
    assert n == pool and int(table.min()) == (1 << 31) - pool and int(table.max()) == (1 << 31) - 1
    with pytest.raises(ValueError):
        _table(need=[9], layout="shuffled", base_block=(1 << 31) - pool)


# --- top-k -------------------------------------------------------------------


def _topk(mode: TopkMode, seq: torch.Tensor, width: int = 8, bs: int = 16, k: int = 128) -> torch.Tensor:
    """Rows of requests of these lengths, one row per entry of ``seq`` (requests by distinct length)."""
    lengths = sorted(set(seq.tolist()))
    owners = torch.tensor([lengths.index(s) for s in seq.tolist()], dtype=torch.int32)
    (host,) = fill.upload(topk.topk_rows(seq_lens=lengths, width=width, block_size=bs, topk=k), device=CPU)
    return topk.topk_indices(
        D, per_row=torch.index_select(host, 0, owners), width=width, block_size=bs, topk=k, mode=mode, device=CPU
    )


SEQ = torch.tensor([0, 1, 5, 100, 127, 128, 129] * 40)


def test_topk_valid_rows_are_positions_below_seq_len() -> None:
    out = _topk(TopkMode.VALID, SEQ)
    assert out.dtype == torch.int32 and out.shape == (280, 128)
    rows = out.long()
    assert (rows[SEQ == 0] == -1).all()
    live = rows[SEQ > 0]
    assert (live >= 0).all() and (live < SEQ[SEQ > 0].unsqueeze(1)).all()
    assert len(set(live[SEQ[SEQ > 0] == 129].reshape(-1).tolist())) == 129  # every position turns up


def test_topk_padded_rows_count_at_most_min_k_seq_len_scattered() -> None:
    out = _topk(TopkMode.PADDED, SEQ)
    valid = out >= 0
    assert ((out == -1) | valid).all() and (out < SEQ.unsqueeze(1)).all()
    counts = valid.sum(1)
    cap = torch.clamp(SEQ, max=128)
    assert (counts <= cap).all()
    assert ((counts == 0) & (cap > 0)).any() and ((counts == cap) & (cap == 128)).any()  # empty and full rows
    assert len(set(counts[SEQ == 129].tolist())) > 10  # counts spread, not a few values
    first = valid.float().argmax(1)
    assert int(first[(counts > 0) & (counts < 64)].max()) > 10  # valid columns scattered, not a prefix


@pytest.mark.parametrize("mode", [TopkMode.NEGATIVE, TopkMode.PAST_TABLE, TopkMode.PAST_SEQ_LEN, TopkMode.MIXED])
def test_topk_classes_appear_in_each_mode(mode: TopkMode) -> None:
    width, bs, k = 8, 16, 128
    out = _topk(mode, SEQ, width, bs, k).long()
    seq = SEQ.unsqueeze(1).expand_as(out)
    top = width * bs
    negative = out < -1
    past_table = out >= torch.clamp(seq, min=top)  # a row with seq_len > M*bs has real positions past the table
    past_seq = (out >= seq) & (out < top)
    present = {"negative": negative.any(), "past_table": past_table.any(), "past_seq": past_seq.any()}
    want = {
        TopkMode.NEGATIVE: {"negative"},
        TopkMode.PAST_TABLE: {"past_table"},
        TopkMode.PAST_SEQ_LEN: {"past_seq"},
        TopkMode.MIXED: {"negative", "past_table", "past_seq"},
    }[mode]
    assert {name for name, hit in present.items() if hit} == want
    assert ((out == -1) | ((out >= 0) & (out < seq))).any()  # the padded rows are still there
    if mode in (TopkMode.NEGATIVE, TopkMode.MIXED):
        assert set(out[negative].tolist()) == {-2, -bs, -k, catalog.INT32_MIN, -(2**20)}
    if mode in (TopkMode.PAST_TABLE, TopkMode.MIXED):
        vals = out[past_table]
        assert (vals == catalog.INT32_MAX).any() and ((vals >= top) & (vals <= top + 2 * bs)).sum() > 10
    hit = (negative | past_table | past_seq).float().mean().item()
    assert 0.1 < hit < 0.3  # 1/4 of the columns, less those that keep their row value


def test_topk_rows_are_a_prefix_stable_function_of_the_row() -> None:
    long = _topk(TopkMode.MIXED, SEQ)
    assert torch.equal(_topk(TopkMode.MIXED, SEQ[:30]), long[:30])


def test_topk_with_a_non_power_of_two_k() -> None:
    out = _topk(TopkMode.PADDED, torch.tensor([1000] * 50), k=384)
    assert out.shape == (50, 384) and (out.ge(0).sum(1) <= 384).all() and out.ge(0).any()


# --- writer inputs -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("values", list(WriterValues))
def test_writer_inputs_shape_determinism_and_prefix(values: WriterValues, dtype: torch.dtype) -> None:
    x = fill.writer_inputs(D, num_tokens=257, values=values, dtype=dtype, device=CPU)
    assert x.shape == (257, 576) and x.dtype == dtype
    assert torch.equal(
        x.view(torch.int16),
        fill.writer_inputs(D, num_tokens=257, values=values, dtype=dtype, device=CPU).view(torch.int16),
    )
    assert torch.equal(
        x[:10].view(torch.int16),
        fill.writer_inputs(D, num_tokens=10, values=values, dtype=dtype, device=CPU).view(torch.int16),
    )
    kv_c, k_pe = x.split([512, 64], dim=-1)  # as vLLM splits its projection output
    assert kv_c.stride() == (576, 1) and k_pe.storage_offset() == 512
    finite = torch.isfinite(x.float())
    if values in (WriterValues.NORMAL, WriterValues.WIDE):
        assert finite.all()
    if values is WriterValues.NAN:
        assert torch.isnan(kv_c.float()).any() and torch.isinf(kv_c.float()).any()
    assert torch.unique(x.view(torch.int16), dim=0).shape[0] == 257


def test_writer_wide_spreads_tile_magnitudes_and_extreme_has_zero_tiles() -> None:
    wide = fill.writer_inputs(D, num_tokens=512, values="wide", device=CPU).float()
    amax = wide[:, :512].reshape(-1, 128).abs().amax(1)
    assert math.log2(amax.max() / amax.min()) > 50
    ext = fill.writer_inputs(D, num_tokens=512, values="extreme", device=CPU).float()
    tiles = ext[:, :512].reshape(-1, 128)
    assert 0.1 < (tiles == 0).all(1).float().mean() < 0.25  # 1/6 of the tiles
    assert (tiles.abs() == 448.0).any() and (tiles.abs() > 1e38).any()


# --- slot mappings -------------------------------------------------------------


@pytest.mark.parametrize("n,num_slots", [(0, 5), (1, 1), (10, 10), (100, 1000), (5000, 1 << 30), (64, 1 << 27)])
def test_distinct_slots_are_distinct_and_in_range(n: int, num_slots: int) -> None:
    slots = fill.distinct_slots(D, n=n, num_slots=num_slots, device=CPU)
    assert slots.dtype == torch.int64 and slots.shape == (n,)
    assert torch.unique(slots).shape[0] == n
    if n:
        assert int(slots.min()) >= 0 and int(slots.max()) < num_slots
    if n == num_slots > 1:
        assert not torch.equal(slots, torch.arange(n))  # a shuffled permutation


def test_distinct_slots_padding_and_limits() -> None:
    slots = fill.distinct_slots(D, n=4000, num_slots=1 << 20, padding=True, device=CPU)
    pad = slots == -1
    assert 0.2 < pad.float().mean() < 0.3
    kept = slots[~pad]
    assert torch.unique(kept).shape[0] == kept.shape[0]
    with pytest.raises(ValueError):
        fill.distinct_slots(D, n=6, num_slots=5, device=CPU)
    with pytest.raises(ValueError):
        fill.distinct_slots(D, n=1, num_slots=(1 << 31) + 1, device=CPU)


# --- the host plans, vectorized ------------------------------------------------


def _plan_rows_by_loop(need, layout, live):
    """plan_table's rows and pool as a loop over requests states them (the vectorized one's reference)."""
    shared = max(1, min(need) // 2) if layout == "shared_prefix" and len(need) > 1 and min(need) > 0 else 0
    ranges = [(0, n - 1) for n in need] if live is None else [(lo, min(hi, n - 1)) for (lo, hi), n in zip(live, need)]
    rows, at = [], shared
    for n, (lo, hi) in zip(need, ranges):
        start = max(lo, shared)
        rows.append([n, at - start, start, hi])
        at += max(0, hi - start + 1)
    return rows, at


@pytest.mark.parametrize("seed", range(40))
def test_vectorized_plans_match_a_loop_over_requests(seed: int) -> None:
    import random

    rng = random.Random(seed)
    need = [rng.choice([0, 1, 2, rng.randint(0, 300)]) for _ in range(rng.randint(1, 40))]
    live = None
    if seed % 2:
        live = [(1, 0) if rng.random() < 0.2 else sorted((rng.randint(0, n + 2), rng.randint(0, n + 2))) for n in need]
    layout = ("contiguous", "shuffled", "shared_prefix")[seed % 3]
    plan = fill.plan_table(need=need, layout=layout, spare_blocks=seed % 4, live=live)
    rows, at = _plan_rows_by_loop(need, layout, live)
    assert plan.rows.tolist() == rows and plan.pool == max(at + seed % 4, 1)
    seqs = [rng.choice([0, 1, rng.randint(0, 5000)]) for _ in range(len(need))]
    width, bs, k = max(need) + 1, rng.choice([1, 16, 64]), rng.choice([16, 2048])
    by_loop = []
    for s in seqs:
        cap, span = min(k, s), width * bs - s
        m = (cap + 1) // 6
        by_loop.append(
            [max(s, 1), -1 if s == 0 else 0, cap + 1 + 2 * m, m, cap, s, max(span, 1), (1 << 29) if span > 0 else 0]
        )
    assert topk.topk_rows(seq_lens=seqs, width=width, block_size=bs, topk=k).tolist() == by_loop
