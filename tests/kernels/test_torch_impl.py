"""The torch implementations (convert, gather, writer) against the oracles.

Bit patterns of bf16 results are compared through ``.view(torch.int16)``, NaN
by position only (SPEC §2).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.kernels.checks import (  # noqa: E402
    CONVERT_REJECTS,
    GATHER_TORCH_REJECTS,
    WRITER_TORCH_REJECTS,
    InvalidInputError,
)
from mlafuzz.kernels.torch_impl import (  # noqa: E402
    convert_torch,
    dequant_records_torch,
    gather_torch,
    writer_torch,
)
from mlafuzz.oracles import revisions  # noqa: E402
from mlafuzz.oracles.codec import dequant_records as oracle_dequant  # noqa: E402
from mlafuzz.oracles.codec import write_records as oracle_write_records  # noqa: E402
from mlafuzz.oracles.convert import convert as oracle_convert  # noqa: E402
from mlafuzz.oracles.gather import gather as oracle_gather  # noqa: E402
from mlafuzz.oracles.writer_scale import NEWEST, REVISIONS  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
FLT_MIN = torch.finfo(torch.float32).tiny


# ------------------------------------------------------------ references


def f64_dequant(records):
    """An independent second reference for dequant: the f64 product of an fp8
    value and an f32 scale is exact, so f64 -> f32 is the IEEE f32 multiply,
    then torch's RNE -> bf16."""
    n = records.shape[0]
    codes = records[:, :512].contiguous().view(torch.float8_e4m3fn).double()
    scales = records[:, 512:528].contiguous().view(torch.float32).double()
    nope = (codes.view(n, 4, 128) * scales[:, :, None]).float().bfloat16().view(n, 512)
    rope = records[:, 528:].contiguous().view(torch.bfloat16)
    return torch.cat([nope, rope], 1)


def reference_gather(src_cache, block_table, ws, batch_size, seq_starts, total):
    return oracle_gather(
        src_cache=src_cache,
        block_table=block_table,
        workspace_starts=ws,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
    )


def local_fp8_rne(q):
    """f32 -> e4m3fn code by nearest of the 127 non-negative finite values, ties to
    the even code; saturating; NaN -> 0x7F. Uses only the exact fp8 -> f32 decode."""
    table = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    a = q.abs().clamp(max=448.0).nan_to_num(0.0)
    hi = torch.searchsorted(table, a).clamp(max=126)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - table[lo], table[hi] - a
    pick = torch.where(d_lo < d_hi, lo, torch.where(d_hi < d_lo, hi, torch.where(lo % 2 == 0, lo, hi)))
    code = pick | torch.where(torch.signbit(q), 0x80, 0)
    return torch.where(torch.isnan(q), 0x7F, code).to(torch.uint8)


def reference_write(kv_c, k_pe, kv_cache, slot_mapping, revision=NEWEST):
    # The torch writer follows either contract revision (SPEC section 7), the newest by default.
    return (
        oracle_write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, revision=revision)
        .view(torch.uint8)
        .cpu()
    )


def same_bits(a, b):
    """bf16 tensors equal bit for bit, NaN compared by position only."""
    a, b = a.cpu(), b.cpu()
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a.view(torch.int16)[~na], b.view(torch.int16)[~nb])


# ---------------------------------------------------------------- records

SCALES = [
    1.0,
    0.5,
    3.0e-3,
    FLT_MIN,
    2.0**-130,
    2.0**-149,
    2.0**100,
    3.0e38,
    0.0,
    -2.0,
    float("inf"),
    float("nan"),
    1.7e-39,
]


def make_cache(g, num_blocks, bs):
    """Random records: every code (NaN codes included), a catalog of scales that
    makes subnormal, overflowing and NaN products, random rope bit patterns."""
    cache = torch.randint(0, 256, (num_blocks, bs, 656), generator=g, dtype=torch.uint8)
    pick = torch.randint(0, len(SCALES) + 3, (num_blocks, bs, 4), generator=g)
    rand = torch.rand((num_blocks, bs, 4), generator=g) * 4
    cat = torch.tensor(SCALES + [0.0] * 3)[pick.clamp(max=len(SCALES) + 2)]
    scales = torch.where(pick >= len(SCALES), rand, cat).float()
    cache[..., 512:528] = scales.view(torch.uint8).view(num_blocks, bs, 16)
    return cache


# ---------------------------------------------------------------- dequant


def test_dequant_all_codes_and_extreme_scales_bit_exact():
    codes = torch.arange(256, dtype=torch.uint8).repeat(2)  # 512 codes, all 256 twice
    rows = []
    for s in SCALES:
        rec = torch.zeros(656, dtype=torch.uint8)
        rec[:512] = codes
        rec[512:528] = torch.tensor([s, s, s, s], dtype=torch.float32).view(torch.uint8)
        rec[528:] = torch.arange(128, dtype=torch.uint8) * 2
        rows.append(rec)
    records = torch.stack(rows)
    got = dequant_records_torch(records)
    assert same_bits(got, oracle_dequant(records))
    assert same_bits(got, f64_dequant(records))
    # No flush: codes times FLT_MIN give bf16 subnormals, which must survive.
    sub = got[SCALES.index(FLT_MIN), :512].float()
    assert ((sub != 0) & (sub.abs() < FLT_MIN)).any()


# ----------------------------------------------------------------- gather


def _gather_case(g, lens, bs, seq_starts, ws_plus_one, max_blocks=None, num_blocks=16):
    b = len(lens)
    ws = [0]
    for n in lens[:-1]:
        ws.append(ws[-1] + n)
    total = sum(lens)
    if ws_plus_one:
        ws = ws + [total]
    need = max([(s + n - 1) // bs + 1 for s, n in zip(seq_starts, lens) if n] + [1])
    m = max_blocks or need + 1
    bt = torch.randint(0, num_blocks, (b, m), generator=g, dtype=torch.int32)
    cache = make_cache(g, num_blocks, bs)
    return (cache, bt, torch.tensor(ws, dtype=torch.int32), torch.tensor(seq_starts, dtype=torch.int32), total)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(0, 9), min_size=1, max_size=3),
    bs=st.sampled_from([1, 2, 4, 64]),
    starts=st.lists(st.integers(0, 70), min_size=3, max_size=3),
    ws_plus_one=st.booleans(),
    no_seq_starts=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_gather_matches_oracle_on_drawn_batches(lens, bs, starts, ws_plus_one, no_seq_starts, seed):
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    ss = [0] * b if no_seq_starts else starts[:b]
    cache, bt, ws, ss_t, total = _gather_case(g, lens, bs, ss, ws_plus_one)
    dst = torch.full((total, 576), 7.0, dtype=torch.bfloat16)
    gather_torch(cache, dst, bt, ws, b, None if no_seq_starts else ss_t)
    assert same_bits(dst, reference_gather(cache, bt, ws, b, None if no_seq_starts else ss_t, total))


@pytest.mark.parametrize("bs", [1, 3, 64])
def test_gather_batch_of_three_with_seq_starts_and_an_empty_request(bs):
    g = torch.Generator().manual_seed(bs)
    cache, bt, ws, ss, total = _gather_case(g, [5, 0, 7], bs, [bs + 1, 9, 2 * bs - 1], False)
    dst = torch.empty((total, 576), dtype=torch.bfloat16)
    gather_torch(cache, dst, bt, ws, 3, ss)
    assert same_bits(dst, reference_gather(cache, bt, ws, 3, ss, total))
    # Request 0 really starts at position bs + 1 (the bug seq_starts fixed).
    slot = int(bt[0, 1]) * bs + 1
    assert same_bits(dst[0:1], oracle_dequant(cache[slot // bs, slot % bs][None]))


def test_gather_batch_of_one_runs_to_the_end_of_dst():
    g = torch.Generator().manual_seed(5)
    cache, bt, ws, ss, total = _gather_case(g, [11], 4, [6], True)
    dst = torch.empty((total, 576), dtype=torch.bfloat16)
    gather_torch(cache, dst, bt, ws[:1], 1, ss)
    assert same_bits(dst, reference_gather(cache, bt, ws, 1, ss, total))


def test_gather_total_zero_and_batch_zero_write_nothing():
    g = torch.Generator().manual_seed(1)
    cache, bt, ws, ss, _ = _gather_case(g, [0, 0], 4, [0, 3], True)
    dst = torch.empty((0, 576), dtype=torch.bfloat16)
    gather_torch(cache, dst, bt, ws, 2, ss)
    gather_torch(cache, dst, bt, ws[:0], 0, None)
    # batch_size == 0 with rows in dst: rows nobody owns (the oracle's reading too).
    dst2 = torch.full((3, 576), 1.5, dtype=torch.bfloat16)
    with pytest.raises(InvalidInputError) as info:
        gather_torch(cache, dst2, bt, ws[:0], 0, None)
    assert info.value.reason == "ws0_nonzero" and (dst2 == 1.5).all()


def test_gather_negative_seq_start_of_an_empty_request_is_legal():
    g = torch.Generator().manual_seed(2)
    cache, bt, ws, ss, total = _gather_case(g, [4, 0, 3], 4, [1, 0, 2], False)
    ss[1] = -5  # request 1 has no rows: it reads nothing
    dst = torch.empty((total, 576), dtype=torch.bfloat16)
    gather_torch(cache, dst, bt, ws, 3, ss)
    assert same_bits(dst, reference_gather(cache, bt, ws, 3, ss, total))


def test_gather_accepts_an_fp8_view_of_the_cache_and_a_strided_dst():
    g = torch.Generator().manual_seed(9)
    cache, bt, ws, ss, total = _gather_case(g, [3, 4], 2, [1, 0], False)
    wide = torch.zeros((total, 2 * 576), dtype=torch.bfloat16)
    dst = wide[:, ::2]
    gather_torch(cache.view(torch.float8_e4m3fn), dst, bt, ws, 2, ss)
    assert same_bits(dst, reference_gather(cache, bt, ws, 2, ss, total))
    assert (wide[:, 1::2] == 0).all()


def _ok_gather(**changes):
    g = torch.Generator().manual_seed(0)
    cache, bt, ws, ss, total = _gather_case(g, [3, 2], 4, [1, 2], False, max_blocks=2, num_blocks=8)
    a = dict(
        src_cache=cache,
        dst=torch.full((total, 576), 3.0, dtype=torch.bfloat16),
        block_table=bt,
        workspace_starts=ws,
        batch_size=2,
        seq_starts=ss,
    )
    a.update(changes)
    return a


I32 = torch.int32
INVALID_GATHER = {
    "cache_int8": ("wrong_dtype", dict(src_cache=torch.zeros((8, 4, 656), dtype=torch.int8))),
    "dst_f32": ("wrong_dtype", dict(dst=torch.zeros((5, 576)))),
    "table_int64": ("wrong_dtype", dict(block_table=torch.zeros((2, 2), dtype=torch.int64))),
    "ws_int64": ("wrong_dtype", dict(workspace_starts=torch.tensor([0, 3]))),
    "seq_starts_int64": ("wrong_dtype", dict(seq_starts=torch.tensor([1, 2]))),
    "dst_575_columns": ("wrong_shape", dict(dst=torch.zeros((5, 575), dtype=torch.bfloat16))),
    "record_655_bytes": ("wrong_shape", dict(src_cache=torch.zeros((8, 4, 655), dtype=torch.uint8))),
    "ws_shorter_than_batch": ("wrong_shape", dict(workspace_starts=torch.tensor([0], dtype=I32))),
    "negative_batch": ("wrong_shape", dict(batch_size=-1)),
    "dst_other_device": ("device_mismatch", dict(dst=torch.zeros((5, 576), dtype=torch.bfloat16, device="meta"))),
    "ws0_nonzero": ("ws0_nonzero", dict(workspace_starts=torch.tensor([1, 3], dtype=I32))),
    "ws_decreasing": (
        "ws_decreasing",
        dict(
            workspace_starts=torch.tensor([0, 3, 2], dtype=I32),
            batch_size=3,
            block_table=torch.zeros((3, 2), dtype=I32),
            seq_starts=torch.zeros(3, dtype=I32),
        ),
    ),
    "ws_past_total": ("ws_past_total", dict(workspace_starts=torch.tensor([0, 6], dtype=I32))),
    "block_index_past_table": ("block_index_past_table", dict(seq_starts=torch.tensor([6, 2], dtype=I32))),
    "block_id_past_cache": ("block_id_past_cache", dict(block_table=torch.tensor([[8, 0], [1, 1]], dtype=I32))),
    "negative_block_id": ("block_id_past_cache", dict(block_table=torch.tensor([[-1, 0], [1, 1]], dtype=I32))),
    "negative_seq_start": ("negative_seq_start", dict(seq_starts=torch.tensor([-1, 2], dtype=I32))),
}


@pytest.mark.parametrize("case", sorted(INVALID_GATHER))
def test_gather_rejects_invalid_input_without_writing(case):
    reason, changes = INVALID_GATHER[case]
    assert reason in GATHER_TORCH_REJECTS
    args = _ok_gather(**changes)
    before = args["dst"].clone()
    with pytest.raises((ValueError, TypeError)) as info:
        gather_torch(**args)
    assert isinstance(info.value, InvalidInputError) and info.value.reason == reason
    if args["dst"].device.type != "meta":
        assert torch.equal(args["dst"], before)


def test_gather_valid_baseline_of_the_rejection_cases_runs():
    gather_torch(**_ok_gather())


def test_gather_checks_only_table_entries_it_reads_and_ignores_the_last_cumulative_entry():
    # Entry [0, 1] is never read (request 0 stays in block 0), and ws[2] is
    # the ignored tail of a [B+1] array: neither may cause a rejection.
    args = _ok_gather(
        block_table=torch.tensor([[0, 99], [1, 1]], dtype=I32), workspace_starts=torch.tensor([0, 3, 12345], dtype=I32)
    )
    gather_torch(**args)
    assert same_bits(
        args["dst"],
        reference_gather(args["src_cache"], args["block_table"], args["workspace_starts"], 2, args["seq_starts"], 5),
    )


# ----------------------------------------------------------------- writer


def _writer_inputs(g, t, dtype=torch.bfloat16):
    kv_c = (torch.randn((t, 512), generator=g) * torch.rand((t, 1), generator=g) * 10).to(dtype)
    k_pe = torch.randint(-(2**15), 2**15, (t, 64), generator=g, dtype=torch.int16).view(dtype)
    return kv_c, k_pe


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_writer_matches_oracle_with_padding_slots(dtype, revision):
    g = torch.Generator().manual_seed(3)
    kv_c, k_pe = _writer_inputs(g, 6, dtype)
    cache = torch.randint(0, 256, (3, 4, 656), generator=g, dtype=torch.uint8)
    slots = torch.tensor([5, -1, 0, 11, -1, 7], dtype=torch.int64)
    want = reference_write(kv_c, k_pe, cache, slots, revision)
    writer_torch(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.tensor(1.0), revision=revision)
    assert torch.equal(cache, want)


def test_writer_duplicate_slots_keep_the_last_token():
    g = torch.Generator().manual_seed(4)
    kv_c, k_pe = _writer_inputs(g, 5)
    cache = torch.zeros((2, 2, 656), dtype=torch.uint8)
    slots = torch.tensor([1, 3, 1, -1, 1])
    want = reference_write(kv_c, k_pe, cache, slots)
    writer_torch(kv_c, k_pe, cache, slots)
    assert torch.equal(cache, want)
    assert torch.equal(cache[0, 1, 528:], k_pe[4].view(torch.uint8))


def test_writer_uses_only_the_first_len_slot_mapping_rows_of_kv_c():
    g = torch.Generator().manual_seed(6)
    kv_c, k_pe = _writer_inputs(g, 6)  # CUDA-graph padding: more rows than slots
    cache = torch.zeros((1, 4, 656), dtype=torch.uint8)
    slots = torch.tensor([2, 0, 3])
    want = reference_write(kv_c, k_pe, cache, slots)
    writer_torch(kv_c, k_pe, cache, slots)
    assert torch.equal(cache, want)


@pytest.mark.parametrize("revision", REVISIONS)
def test_writer_special_values_nan_inf_zero_tiny_and_saturation(revision):
    kv_c = torch.zeros((4, 512), dtype=torch.float32)
    kv_c[0, :128] = torch.linspace(-3, 3, 128)
    kv_c[0, 5] = float("nan")  # ignored by amax, coded 0x7F
    kv_c[0, 128:256] = -0.0  # all-zero tile: scale FLT_MIN, codes 0x80
    kv_c[0, 256:384] = torch.linspace(-1e-38, 1e-38, 128)  # subnormal inputs
    kv_c[0, 384] = float("inf")  # inf tile: scale inf, inf/inf = NaN
    kv_c[1] = torch.randn(512) * 1e4
    kv_c[2, :128] = float("nan")  # all-NaN tile
    kv_c[3] = torch.linspace(-65000, 65000, 512)
    kv_c = kv_c.bfloat16()
    k_pe = torch.full((4, 64), float("nan"), dtype=torch.bfloat16)
    cache = torch.zeros((1, 4, 656), dtype=torch.uint8)
    slots = torch.arange(4)
    want = reference_write(kv_c, k_pe, cache, slots, revision)
    writer_torch(kv_c, k_pe, cache, slots, revision=revision)
    assert torch.equal(cache, want)
    rec = cache[0, 0]
    assert rec[5] == 0x7F and (rec[128:256] == 0x80).all() and rec[384] == 0x7F
    scales = rec[512:528].view(torch.float32)
    # An all-zero tile gets the floor: FLT_MIN, or 2**-13 (the power of two above 1e-4f).
    floor = FLT_MIN if revisions.get(revision).rule("writer_scale") == "flt_min" else 2.0**-13
    assert scales[1] == floor and torch.isinf(scales[3])
    assert (cache[0, 2, :128] == 0x7F).all()


def test_writer_codes_round_ties_to_even_and_saturate():
    # A tile whose amax is 448 has scale exactly 1, so codes are e4m3(x) itself;
    # feed every midpoint between neighbouring e4m3 values, and the values.
    vals = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (vals[1:] + vals[:-1]) / 2
    x = torch.cat([mids, -mids, vals, -vals, torch.tensor([460.0, -500.0, 2.0**-13, -(2.0**-11)])])
    x = torch.cat([x, torch.zeros((-x.numel()) % 127)]).view(-1, 127)
    x = torch.cat([torch.full((x.shape[0], 1), 448.0), x], 1)  # every tile holds 448
    x = torch.cat([x.flatten(), torch.zeros((-x.numel()) % 512)])
    assert torch.equal(x.bfloat16().float(), x)  # all exactly representable
    kv_c = x.view(-1, 512).bfloat16()
    t = kv_c.shape[0]
    cache = torch.zeros((t, 1, 656), dtype=torch.uint8)
    writer_torch(kv_c, torch.zeros((t, 64), dtype=torch.bfloat16), cache, torch.arange(t))
    assert torch.equal(
        cache,
        reference_write(kv_c, torch.zeros((t, 64), dtype=torch.bfloat16), torch.zeros_like(cache), torch.arange(t)),
    )
    scales = cache[:, 0, 512:528].contiguous().view(torch.float32)
    has_448 = kv_c.float().abs().view(t, 4, 128).amax(-1) == 448
    assert (scales[has_448] == 1.0).all() and has_448.sum() >= 4
    want = local_fp8_rne(kv_c.float().view(t, 4, 128) / scales[:, :, None]).view(t, 512)
    assert torch.equal(cache[:, 0, :512], want)


def test_writer_then_gather_roundtrips_within_fp8_precision():
    g = torch.Generator().manual_seed(8)
    kv_c, k_pe = _writer_inputs(g, 5)
    cache = torch.zeros((2, 4, 656), dtype=torch.uint8)
    writer_torch(kv_c, k_pe, cache, torch.tensor([4, 5, 6, 7, 0]))
    dst = torch.empty((5, 576), dtype=torch.bfloat16)
    gather_torch(cache, dst, torch.tensor([[1, 0]], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), 1)
    assert torch.equal(dst[:, 512:].view(torch.int16), k_pe.view(torch.int16))
    x, y = kv_c.float(), dst[:, :512].float()
    tile_max = x.abs().view(5, 4, 128).amax(-1, keepdim=True).expand(5, 4, 128).reshape(5, 512)
    assert ((x - y).abs() <= x.abs() / 16 + tile_max / 448 / 8 * 1.01 + 1e-30).all()


INVALID_WRITER = {
    "fp8_e4m3_dtype": ("unsupported_kv_cache_dtype", dict(kv_cache_dtype="fp8_e4m3")),
    "kv_c_f32": ("wrong_dtype", dict(kv_c=torch.zeros((2, 512)))),
    "slots_f32": ("wrong_dtype", dict(slot_mapping=torch.zeros(2))),
    "kv_c_511": ("wrong_shape", dict(kv_c=torch.zeros((2, 511), dtype=torch.bfloat16))),
    "cache_655": ("wrong_shape", dict(kv_cache=torch.zeros((2, 4, 655), dtype=torch.uint8))),
    "cache_other_device": (
        "device_mismatch",
        dict(kv_cache=torch.zeros((2, 4, 656), dtype=torch.uint8, device="meta")),
    ),
    "slot_past_cache": ("slot_past_cache", dict(slot_mapping=torch.tensor([0, 8]))),
}


@pytest.mark.parametrize("case", sorted(INVALID_WRITER))
def test_writer_rejects_invalid_input_without_writing(case):
    reason, changes = INVALID_WRITER[case]
    assert reason in WRITER_TORCH_REJECTS
    args = dict(
        kv_c=torch.ones((2, 512), dtype=torch.bfloat16),
        k_pe=torch.ones((2, 64), dtype=torch.bfloat16),
        kv_cache=torch.zeros((2, 4, 656), dtype=torch.uint8),
        slot_mapping=torch.tensor([0, 1]),
    )
    args.update(changes)
    before = args["kv_cache"].clone()
    with pytest.raises((ValueError, TypeError)) as info:
        writer_torch(**args)
    assert info.value.reason == reason
    if args["kv_cache"].device.type != "meta":
        assert torch.equal(args["kv_cache"], before)


# ---------------------------------------------------------------- convert


def _reference_convert(req, bt, ti, bs, ids=None, starts=None):
    out, counts = oracle_convert(
        req_id=req,
        block_table=bt,
        token_indices=ti,
        block_size=bs,
        has_prefill_workspace=ids is not None,
        prefill_workspace_request_ids=ids,
        prefill_workspace_starts=starts,
    )
    return out.long(), counts.long()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 5),
    tiles=st.integers(1, 2),
    bs=st.sampled_from([1, 3, 16, 64]),
    m=st.integers(0, 4),
    prefill=st.booleans(),
    strided=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_convert_torch_matches_oracle_on_drawn_inputs(n, tiles, bs, m, prefill, strided, seed):
    g = torch.Generator().manual_seed(seed)
    k = 32 * tiles
    req = torch.randint(0, 3, (n,), generator=g, dtype=torch.int32)
    bt = torch.randint(0, 999, (3, m), generator=g, dtype=torch.int32)
    ti = torch.randint(-3, m * bs + 2 * bs, (k, n) if strided else (n, k), generator=g, dtype=torch.int32)
    ti = ti.t() if strided else ti
    ti[torch.rand(ti.shape, generator=g) < 0.1] = -(2**31)
    ids = torch.randint(-1, 2, (n,), generator=g, dtype=torch.int32) if prefill else None
    starts = torch.tensor([0, 5000], dtype=torch.int32) if prefill else None
    out, counts = convert_torch(
        req,
        bt,
        ti,
        BLOCK_SIZE=bs,
        NUM_TOPK_TOKENS=k,
        BLOCK_N=32,
        HAS_PREFILL_WORKSPACE=prefill,
        prefill_workspace_request_ids=ids,
        prefill_workspace_starts=starts,
        return_valid_counts=True,
    )
    want_out, want_counts = _reference_convert(req, bt, ti, bs, ids, starts)
    assert out.dtype == torch.int32 and counts.dtype == torch.int32
    assert torch.equal(out.long(), want_out) and torch.equal(counts.long(), want_counts)
    assert torch.equal(
        convert_torch(
            req,
            bt,
            ti,
            BLOCK_SIZE=bs,
            NUM_TOPK_TOKENS=k,
            BLOCK_N=32,
            HAS_PREFILL_WORKSPACE=prefill,
            prefill_workspace_request_ids=ids,
            prefill_workspace_starts=starts,
        ),
        out,
    )


@pytest.mark.parametrize(
    "reason,changes",
    [
        ("length_mismatch", dict(req_id=torch.zeros(3, dtype=torch.int32))),
        ("wrong_dtype", dict(token_indices=torch.zeros((2, 64), dtype=torch.int64))),
        ("k_mismatch", dict(NUM_TOPK_TOKENS=128)),
        ("k_not_multiple_of_block_n", dict(BLOCK_N=128, NUM_TOPK_TOKENS=64)),
        ("bad_block_size", dict(BLOCK_SIZE=0)),
    ],
)
def test_convert_torch_rejects_the_spec_classes(reason, changes):
    args = dict(
        req_id=torch.zeros(2, dtype=torch.int32),
        block_table=torch.zeros((1, 1), dtype=torch.int32),
        token_indices=torch.zeros((2, 64), dtype=torch.int32),
        BLOCK_SIZE=64,
        NUM_TOPK_TOKENS=64,
        BLOCK_N=32,
    )
    args.update(changes)
    assert reason in CONVERT_REJECTS
    with pytest.raises(InvalidInputError) as info:
        convert_torch(**args)
    assert info.value.reason == reason


# -------------------------------------------------------------------- GPU


@gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_torch_impls_on_cuda_match_cpu_bit_for_bit():
    g = torch.Generator().manual_seed(42)
    cache, bt, ws, ss, total = _gather_case(g, [300, 0, 257], 64, [64, 3, 130], True, num_blocks=40)
    dst = torch.empty((total, 576), dtype=torch.bfloat16, device="cuda")
    gather_torch(cache.cuda(), dst, bt.cuda(), ws.cuda(), 3, ss.cuda())
    assert same_bits(dst, reference_gather(cache, bt, ws, 3, ss, total))
    kv_c, k_pe = _writer_inputs(g, 64)
    kv_c[0, 3] = float("nan")
    slots = torch.randperm(40 * 64, generator=g)[:64]
    slots[::7] = -1
    orig = make_cache(g, 40, 64)
    c_cpu, c_gpu = orig.clone(), orig.cuda()
    writer_torch(kv_c, k_pe, c_cpu, slots)
    writer_torch(kv_c.cuda(), k_pe.cuda(), c_gpu, slots.cuda())
    assert torch.equal(c_gpu.cpu(), c_cpu)
    assert torch.equal(c_cpu, reference_write(kv_c, k_pe, orig, slots))


def test_kernels_know_the_oracles_revisions():
    """kernels/ may not import the references, so it keeps its own list: the same names, newest last."""
    from mlafuzz.kernels import revisions

    assert revisions.WRITER_REVISIONS == REVISIONS and revisions.NEWEST == NEWEST


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_writer_scales_are_the_oracles_on_every_16_bit_amax(dtype, revision):
    """Each tile holds one 16-bit pattern (and zeros): every finite amax the writer can see, and
    inf and NaN, against the oracle's tile scales, bit for bit."""
    from mlafuzz.kernels.torch_impl import tile_scales_torch
    from mlafuzz.oracles.codec import tile_scales

    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
    kv_c = torch.zeros((bits.numel() // 4, 512), dtype=dtype)
    kv_c.view(-1, 4, 128)[:, :, 7] = bits.view(-1, 4)
    want = tile_scales(kv_c=kv_c, revision=revision).scale
    got = tile_scales_torch(kv_c, revision=revision)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_writer_refuses_an_unknown_revision_before_writing():
    cache = torch.zeros((1, 2, 656), dtype=torch.uint8)
    with pytest.raises(ValueError, match="revision"):
        writer_torch(
            torch.ones((1, 512), dtype=torch.bfloat16),
            torch.ones((1, 64), dtype=torch.bfloat16),
            cache,
            torch.tensor([0]),
            revision="2026-08",
        )
    assert not cache.any()
