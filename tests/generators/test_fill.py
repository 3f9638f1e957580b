"""Tests for mlafuzz.generators.rng.fill (and fill_records / fill_bits): vectorized device-exact builders."""

from __future__ import annotations

import math

import pytest
import torch

from mlafuzz.generators import catalog
from mlafuzz.generators.paging import build_block_table
from mlafuzz.generators.rng import fill
from mlafuzz.generators.rng.bits import BF16, FP16, half_bits, normal_bits, to_half
from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.spec import Layout, Paging, TopkMode, ValueMode, WriterValues
from mlafuzz.oracles.codec import dequant_records, encode_rows

CPU = "cpu"
S = Stream(2026, "test-fill")


def _scales(rec: torch.Tensor) -> torch.Tensor:
    return rec[:, 512:528].contiguous().view(torch.float32)


def _scale_bits(rec: torch.Tensor) -> set[int]:
    return set((rec[:, 512:528].contiguous().view(torch.int32).reshape(-1).to(torch.int64) & 0xFFFFFFFF).tolist())


# --- bit helpers -------------------------------------------------------------

def test_half_bits_saturates_and_goes_subnormal() -> None:
    sign = torch.tensor([0, 1, 0, 0, 0])
    exp = torch.tensor([0, 40, -14, -20, -40])
    mant = torch.tensor([0, 0x3FF, 0, 0x200, 0x3FF])
    got = to_half(half_bits(sign, exp, mant, FP16), torch.float16).float().tolist()
    assert got == [1.0, -65504.0, 2.0 ** -14, 1.5 * 2.0 ** -20, 0.0]
    assert to_half(half_bits(sign[:1], torch.tensor([-126]), mant[:1], BF16), torch.bfloat16).item() == 2.0 ** -126


# --- block tables --------------------------------------------------------------

@pytest.mark.parametrize("need", [[3, 5, 2], [1], [0, 4], [7, 7, 7, 7], [0, 0]])
def test_contiguous_table_equals_build_block_table(need: list[int]) -> None:
    bs = 16
    paging = Paging(block_size=bs, layout=Layout.CONTIGUOUS, spare_blocks=2, extra_table_cols=1)
    ref, pool = build_block_table(paging=paging, seq_lens=[n * bs for n in need],
                                  gen=torch.Generator().manual_seed(0))
    got, num_blocks = fill.block_table(S, blocks_per_request=torch.tensor(need), layout="contiguous",
                                       spare_blocks=2, extra_cols=1, device=CPU)
    assert torch.equal(got, ref) and num_blocks == pool


@pytest.mark.parametrize("layout", ["shuffled", "shared_prefix"])
@pytest.mark.parametrize("first", [0, 40_000_000])
def test_random_tables_have_distinct_ids_except_the_shared_prefix(layout: str, first: int) -> None:
    need = torch.tensor([6, 9, 4, 12, 4])
    table, num_blocks = fill.block_table(S, blocks_per_request=need, layout=layout, spare_blocks=3,
                                         extra_cols=2, first_block_id=first, device=CPU)
    shared = 2 if layout == "shared_prefix" else 0
    pool = shared + int((need - shared).sum()) + 3
    assert table.dtype == torch.int32 and table.shape == (5, 14) and num_blocks == first + pool
    rows = [table[r, :n].tolist() for r, n in enumerate(need.tolist())]
    assert all((table[r, n:] == 0).all() for r, n in enumerate(need.tolist()))
    for row in rows:
        assert len(set(row)) == len(row) and all(first <= b < first + pool for b in row)
        assert row[:shared] == rows[0][:shared]
    owned = [b for row in rows for b in row[shared:]]
    assert len(set(owned)) == len(owned) and not set(owned) & set(rows[0][:shared])
    assert rows[0] != sorted(rows[0]) or rows[1] != sorted(rows[1])  # shuffled, not arange


def test_block_ids_can_sit_at_the_top_of_a_huge_cache() -> None:
    bs, pool = 64, 8
    first = (1 << 31) - pool  # byte offset of the last block ~ 2**31 * 64 * 656, far past 2**32
    table, num_blocks = fill.block_table(S, blocks_per_request=torch.tensor([8]), layout="shuffled",
                                         first_block_id=first, device=CPU)
    assert num_blocks == 1 << 31 and int(table.min()) == first and int(table.max()) == (1 << 31) - 1
    assert int(table.to(torch.int64).max()) * bs * fill.RECORD_BYTES > 1 << 32
    with pytest.raises(ValueError):
        fill.block_table(S, blocks_per_request=torch.tensor([9]), layout="shuffled", first_block_id=first,
                         device=CPU)


# --- cache records -------------------------------------------------------------

@pytest.mark.parametrize("mode", list(ValueMode))
def test_records_are_deterministic_and_records_at_gives_the_same_rows(mode: ValueMode) -> None:
    full = fill.records(S, mode, n=300, device=CPU)
    assert full.dtype == torch.uint8 and full.shape == (300, 656)
    assert torch.equal(full, fill.records(S, mode, n=300, device=CPU))
    slots = torch.tensor([299, 0, 17, 17, 150, 1])
    assert torch.equal(fill.records_at(S, mode, slots=slots, device=CPU), full[slots])
    pool = fill.make_pool(S, mode, device=CPU)
    assert torch.equal(fill.records_at(S, mode, slots=slots, device=CPU, pool=pool), full[slots])
    assert torch.equal(fill.records(S, mode, n=40, device=CPU), full[:40])
    assert not torch.equal(full, fill.records(Stream(1, "other"), mode, n=300, device=CPU))


def test_cache_blocks_are_the_blocks_of_the_whole_cache_and_work_at_huge_ids() -> None:
    bs = 8
    whole = fill.cache(S, "nan", num_blocks=20, block_size=bs, device=CPU)
    ids = torch.tensor([19, 3, 4])
    assert torch.equal(fill.cache_blocks(S, "nan", block_ids=ids, block_size=bs, device=CPU), whole[ids])
    huge = torch.tensor([(1 << 31) - 1, 1 << 30])  # slot * words per record passes 2**32
    got = fill.cache_blocks(S, "nan", block_ids=huge, block_size=bs, device=CPU)
    slots = huge.unsqueeze(1) * bs + torch.arange(bs)
    assert torch.equal(got.reshape(-1, 656), fill.records_at(S, "nan", slots=slots.reshape(-1), device=CPU))


@pytest.mark.parametrize("mode", list(ValueMode))
def test_records_are_distinct_and_modes_share_no_bytes(mode: ValueMode) -> None:
    recs = fill.records(S, mode, n=4096, device=CPU)
    assert torch.unique(recs, dim=0).shape[0] == 4096
    other = fill.records(S, ValueMode.SUBNORMAL if mode is ValueMode.EXTREME_SCALES else ValueMode.EXTREME_SCALES,
                         n=64, device=CPU)
    assert (recs[:64, :512] != other[:, :512]).float().mean() > 0.9


def test_a_power_of_two_scale_shift_is_the_writer_output_of_the_scaled_input() -> None:
    # The claim the activations mode rests on: encode(x * 2**k) is encode(x) with each scale * 2**k.
    w = Stream(0, "shift").words((64, 512), device=CPU)
    x = to_half(normal_bits(w, BF16), torch.bfloat16)
    k_pe = to_half(normal_bits(w[:, :64], BF16), torch.bfloat16)
    base = encode_rows(kv_c=x, k_pe=k_pe, revision="2026-07")
    for k in (-20, -7, 1, 20):
        shifted = encode_rows(kv_c=x * 2.0 ** k, k_pe=k_pe, revision="2026-07")  # exact: a power of two, far from the range ends
        bits = base[:, 512:528].contiguous().view(torch.int32) + (k << 23)
        assert torch.equal(shifted[:, :512], base[:, :512]) and torch.equal(shifted[:, 528:], base[:, 528:])
        assert torch.equal(shifted[:, 512:528].contiguous().view(torch.int32), bits)


def test_activations_are_pool_writer_outputs_with_shifted_scales() -> None:
    recs = fill.records(S, "activations", n=2048, device=CPU)
    assert torch.isfinite(dequant_records(recs).float()).all()
    pool = fill.make_pool(S, "activations", device=CPU)
    by_codes = {bytes(r[:512].tolist()): r for r in pool}
    for rec in recs[:64]:
        row = by_codes[bytes(rec[:512].tolist())]  # the codes are a pool row's ...
        got = rec[512:528].view(torch.int32).long()
        want = row[512:528].contiguous().view(torch.int32).long()
        shift = got - want  # ... and each scale is its scale times 2**k, |k| <= 20 (zero tiles keep FLT_MIN)
        assert ((shift % (1 << 23)) == 0).all() and (shift.abs() <= 20 << 23).all()
    scales = _scales(recs)
    nonzero = scales[scales > catalog.FLT_MIN]
    assert math.log2(nonzero.max() / nonzero.min()) > 35  # 2**-20..2**20 per tile
    assert (scales == catalog.FLT_MIN).float().mean() > 0.03  # all-zero tiles (1/16)


def test_all_codes_records_each_hold_every_code() -> None:
    recs = fill.records(S, "all_codes", n=200, device=CPU)
    per_record = torch.sort(recs[:, :512].long(), dim=1).values
    assert (per_record == torch.arange(256).repeat_interleave(2)).all()
    assert torch.isfinite(_scales(recs)).all() and (_scales(recs) > 0).all()


@pytest.mark.parametrize("mode,table", [("extreme_scales", catalog.EXTREME_SCALES),
                                        ("subnormal", catalog.SUBNORMAL_SCALES)])
def test_catalog_scale_modes(mode: str, table: tuple[float, ...]) -> None:
    recs = fill.records(S, mode, n=512, device=CPU)
    allowed = set(torch.tensor(table, dtype=torch.float32).view(torch.int32).to(torch.int64).bitwise_and(
        0xFFFFFFFF).tolist())
    assert _scale_bits(recs) == allowed  # every catalog value, nothing else
    assert not ((recs[:, :512] & 0x7F) == 0x7F).any()  # no NaN codes


def test_nan_mode_has_nan_codes_nonfinite_scales_and_special_ropes() -> None:
    recs = fill.records(S, "nan", n=1024, device=CPU)
    codes = recs[:, :512]
    assert 0.1 < ((codes & 0x7F) == 0x7F).float().mean() < 0.15  # 1/8 + 1/128
    scales = _scales(recs)
    assert torch.isnan(scales).any() and (scales == math.inf).any() and (scales == -math.inf).any()
    rope = recs[:, 528:].contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    assert set(catalog.ROPE_SPECIAL_BITS) <= set(rope.reshape(-1).tolist())


# --- top-k -------------------------------------------------------------------

def _topk(mode: TopkMode, seq: torch.Tensor, width: int = 8, bs: int = 16, k: int = 128) -> torch.Tensor:
    return fill.topk_indices(S, seq_lens=seq, width=width, block_size=bs, topk=k, mode=mode, device=CPU)


SEQ = torch.tensor([0, 1, 5, 100, 127, 128, 129] * 40)


def test_topk_valid_rows_are_positions_below_seq_len() -> None:
    out = _topk(TopkMode.VALID, SEQ)
    assert out.dtype == torch.int32 and out.shape == (280, 128)
    rows = out.long()
    assert (rows[SEQ == 0] == -1).all()
    live = rows[SEQ > 0]
    assert (live >= 0).all() and (live < SEQ[SEQ > 0].unsqueeze(1)).all()


def test_topk_padded_rows_count_at_most_min_k_seq_len() -> None:
    out = _topk(TopkMode.PADDED, SEQ)
    valid = out >= 0
    assert ((out == -1) | valid).all() and (out < SEQ.unsqueeze(1)).all()
    counts = valid.sum(1)
    cap = torch.clamp(SEQ, max=128)
    assert (counts <= cap).all()
    assert ((counts == 0) & (cap > 0)).any() and ((counts == cap) & (cap == 128)).any()  # empty and full rows
    assert len(set(counts[SEQ == 129].tolist())) > 10  # counts spread, not a few values


@pytest.mark.parametrize("mode", [TopkMode.NEGATIVE, TopkMode.PAST_TABLE, TopkMode.PAST_SEQ_LEN, TopkMode.MIXED])
def test_topk_classes_appear_in_each_mode(mode: TopkMode) -> None:
    width, bs, k = 8, 16, 128
    out = _topk(mode, SEQ, width, bs, k).long()
    seq = SEQ.unsqueeze(1).expand_as(out)
    top = width * bs
    negative = (out < -1)
    past_table = out >= torch.clamp(seq, min=top)  # a row with seq_len > M*bs has real positions past the table
    past_seq = (out >= seq) & (out < top)
    present = {"negative": negative.any(), "past_table": past_table.any(), "past_seq": past_seq.any()}
    want = {TopkMode.NEGATIVE: {"negative"}, TopkMode.PAST_TABLE: {"past_table"},
            TopkMode.PAST_SEQ_LEN: {"past_seq"}, TopkMode.MIXED: {"negative", "past_table", "past_seq"}}[mode]
    assert {name for name, hit in present.items() if hit} == want
    assert ((out == -1) | ((out >= 0) & (out < seq))).any()  # the padded rows are still there
    if mode in (TopkMode.NEGATIVE, TopkMode.MIXED):
        assert set(out[negative].tolist()) == {-2, -bs, -k, catalog.INT32_MIN, -(2 ** 20)}
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
    x = fill.writer_inputs(S, num_tokens=257, values=values, dtype=dtype, device=CPU)
    assert x.shape == (257, 576) and x.dtype == dtype
    assert torch.equal(x.view(torch.int16), fill.writer_inputs(S, num_tokens=257, values=values, dtype=dtype,
                                                              device=CPU).view(torch.int16))
    assert torch.equal(x[:10].view(torch.int16), fill.writer_inputs(S, num_tokens=10, values=values, dtype=dtype,
                                                                    device=CPU).view(torch.int16))
    kv_c, k_pe = x.split([512, 64], dim=-1)  # as vLLM splits its projection output
    assert kv_c.stride() == (576, 1) and k_pe.storage_offset() == 512
    finite = torch.isfinite(x.float())
    if values in (WriterValues.NORMAL, WriterValues.WIDE):
        assert finite.all()
    if values is WriterValues.NAN:
        assert torch.isnan(kv_c.float()).any() and torch.isinf(kv_c.float()).any()
    assert torch.unique(x.view(torch.int16), dim=0).shape[0] == 257


def test_writer_wide_spreads_tile_magnitudes_and_extreme_has_zero_tiles() -> None:
    wide = fill.writer_inputs(S, num_tokens=512, values="wide", device=CPU).float()
    amax = wide[:, :512].reshape(-1, 128).abs().amax(1)
    assert math.log2(amax.max() / amax.min()) > 50
    ext = fill.writer_inputs(S, num_tokens=512, values="extreme", device=CPU).float()
    tiles = ext[:, :512].reshape(-1, 128)
    assert 0.1 < (tiles == 0).all(1).float().mean() < 0.25  # 1/6 of the tiles
    assert (tiles.abs() == 448.0).any() and (tiles.abs() > 1e38).any()


# --- slot mappings -------------------------------------------------------------

@pytest.mark.parametrize("n,num_slots", [(0, 5), (1, 1), (10, 10), (100, 1000), (5000, 1 << 31), (64, 1 << 27)])
def test_distinct_slots_are_distinct_and_in_range(n: int, num_slots: int) -> None:
    slots = fill.distinct_slots(S, n=n, num_slots=num_slots, device=CPU)
    assert slots.dtype == torch.int64 and slots.shape == (n,)
    assert torch.unique(slots).shape[0] == n
    if n:
        assert int(slots.min()) >= 0 and int(slots.max()) < num_slots
    if n == num_slots > 1:
        assert not torch.equal(slots, torch.arange(n))  # a shuffled permutation


def test_distinct_slots_padding_and_limits() -> None:
    slots = fill.distinct_slots(S, n=4000, num_slots=1 << 20, padding=True, device=CPU)
    pad = slots == -1
    assert 0.2 < pad.float().mean() < 0.3
    kept = slots[~pad]
    assert torch.unique(kept).shape[0] == kept.shape[0]
    with pytest.raises(ValueError):
        fill.distinct_slots(S, n=6, num_slots=5, device=CPU)
    with pytest.raises(ValueError):
        fill.distinct_slots(S, n=1, num_slots=(1 << 31) + 1, device=CPU)


# --- exactness on the GPU ------------------------------------------------------

def _every_output(device: str) -> list[torch.Tensor]:
    seq = torch.tensor([0, 1, 5, 100, 129, 3000] * 8)
    out = [fill.block_table(S, blocks_per_request=torch.tensor([3, 9, 4]), layout=layout, spare_blocks=2,
                            extra_cols=1, first_block_id=1 << 30, device=device)[0]
           for layout in Layout]
    for mode in ValueMode:
        out.append(fill.records(S, mode, n=777, device=device))
        out.append(fill.cache_blocks(S, mode, block_ids=torch.tensor([(1 << 31) - 1, 5]), block_size=64,
                                     device=device))
    for mode in TopkMode:
        out.append(fill.topk_indices(S, seq_lens=seq, width=40, block_size=64, topk=256, mode=mode, device=device))
    for values in WriterValues:
        for dtype in (torch.bfloat16, torch.float16):
            out.append(fill.writer_inputs(S, num_tokens=300, values=values, dtype=dtype, device=device))
    out.append(fill.distinct_slots(S, n=3000, num_slots=1 << 28, padding=True, device=device))
    return out


@pytest.mark.gpu
def test_every_fill_output_is_byte_identical_on_cuda() -> None:
    for a, b in zip(_every_output("cpu"), _every_output("cuda"), strict=True):
        assert b.device.type == "cuda" and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))
