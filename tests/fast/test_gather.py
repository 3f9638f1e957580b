"""The fused gather check agrees with the oracle: yes on the oracle's own rows, no on any bit flip."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.generators.catalog import EXTREME_SCALES, NONFINITE_SCALES, SUBNORMAL_SCALES  # noqa: E402
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.spec import Paging, ValueMode  # noqa: E402
from mlafuzz.harness.fast.gather import _bad_pairs, _nan_halves, _unlike_pairs, gather_rows_flag  # noqa: E402
from mlafuzz.oracles import gather as og  # noqa: E402
from mlafuzz.tests.support.helpers import matches, materialize  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _expected(case) -> torch.Tensor:
    t = case.tensors
    return og.gather(
        src_cache=t["src_cache"],
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
        total=case.params["total"],
    )


def _match(case, dst) -> bool:
    t = case.tensors
    return matches(
        gather_rows_flag(
            src_cache=t["src_cache"],
            dst=dst,
            block_table=t["block_table"],
            workspace_starts=t["workspace_starts"],
            batch_size=case.params["batch_size"],
            seq_starts=t["seq_starts"],
        )
    )


def _records_with(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n = codes.shape[0]
    rope = torch.arange(n * 64, dtype=torch.int32).to(torch.int16).reshape(n, 64)
    return torch.cat(
        [
            codes.to(torch.uint8),
            scales.contiguous().view(torch.uint8).reshape(n, 16),
            rope.view(torch.uint8).reshape(n, 128),
        ],
        dim=1,
    )


def test_every_code_times_every_catalog_scale_and_random_scale_bits_match_the_oracle_exactly():
    gen = torch.Generator().manual_seed(0)
    scales = list(EXTREME_SCALES + SUBNORMAL_SCALES + NONFINITE_SCALES) + [1.0, 0.5, 1 / 448]
    n_cat = len(scales)
    rand_bits = torch.randint(0, 2**32, (16, 4), generator=gen, dtype=torch.int64).to(torch.int32)
    rows = n_cat + 16
    codes = torch.arange(256, dtype=torch.int64).repeat(2)[None, :].repeat(rows, 1)  # all 256 codes, twice
    sc = torch.cat([torch.tensor(scales, dtype=torch.float32)[:, None].repeat(1, 4), rand_bits.view(torch.float32)])
    records = _records_with(codes, sc)
    cache = records.reshape(rows, 1, 656).to(DEV)
    table = torch.arange(rows, dtype=torch.int32, device=DEV).reshape(rows, 1)
    ws = torch.arange(rows, dtype=torch.int32, device=DEV)
    expected = og.gather(
        src_cache=cache, block_table=table, workspace_starts=ws, batch_size=rows, seq_starts=None, total=rows
    )
    assert matches(
        gather_rows_flag(
            src_cache=cache, dst=expected, block_table=table, workspace_starts=ws, batch_size=rows, seq_starts=None
        )
    )


@pytest.mark.parametrize("values", list(ValueMode))
@given(seed=st.integers(0, 2**32 - 1), flip=st.integers(0, 2**31))
@settings(max_examples=5, deadline=None)
@pytest.mark.slow
def test_yes_on_the_oracles_rows_no_on_any_single_bit_flip_that_changes_the_value(values, seed, flip):
    spec = GatherSpec(
        requests=(
            GatherRequest(context_len=40, seq_start=5, length=12),
            GatherRequest(context_len=9),
            GatherRequest(context_len=30, seq_start=17, length=9),
        ),
        paging=Paging(block_size=16, layout="shuffled"),
        values=values,
        ws_form="cumulative",
    )
    case = materialize(spec, seed, DEV)
    dst = _expected(case)
    assert _match(case, dst)
    bits = dst.view(torch.int16).clone()
    i, j, b = flip % bits.shape[0], (flip // 7) % 576, (flip // 3) % 16
    old = bits[i, j].clone()
    bits[i, j] ^= (1 << b) if b < 15 else -(1 << 15)
    a, e = bits[i, j].view(torch.bfloat16).float(), old.view(torch.bfloat16).float()
    both_nan = bool(torch.isnan(a)) and bool(torch.isnan(e))  # a payload change is not a difference
    assert _match(case, bits.view(torch.bfloat16)) == both_nan


@given(seed=st.integers(0, 2**32 - 1), flip=st.integers(0, 2**31))
@settings(max_examples=5, deadline=None)
@pytest.mark.slow
def test_two_runs_checked_in_one_pass_say_no_when_either_differs(seed, flip):
    spec = GatherSpec(
        requests=(
            GatherRequest(context_len=33, seq_start=3, length=20),
            GatherRequest(context_len=0),
            GatherRequest(context_len=21),
        ),
        paging=Paging(block_size=8, layout="shuffled"),
        ws_form="cumulative",
    )
    case = materialize(spec, seed, DEV)
    t = case.tensors
    dst = _expected(case)
    args = dict(
        src_cache=t["src_cache"],
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
    )
    assert matches(gather_rows_flag(dst=dst, dst2=dst.clone(), **args))
    bad = dst.view(torch.int16).clone()
    i, j = flip % bad.shape[0], (flip // 5) % 576
    bad[i, j] ^= 0x0100  # an exponent bit: never NaN-to-NaN
    assert not matches(gather_rows_flag(dst=dst, dst2=bad.view(torch.bfloat16), **args))
    assert not matches(gather_rows_flag(dst=bad.view(torch.bfloat16), dst2=dst, **args))
    assert not matches(gather_rows_flag(dst=dst, dst2=dst[:-1], **args))


def test_two_runs_that_differ_only_in_a_nan_payload_are_not_a_match():
    spec = GatherSpec(
        requests=(GatherRequest(context_len=16, length=16),), paging=Paging(block_size=8), values=ValueMode.ALL_CODES
    )
    case = materialize(spec, 3, DEV)
    t = case.tensors
    dst = _expected(case)
    bits = dst.view(torch.int16)
    nan = torch.isnan(dst)
    assert bool(nan.any())
    other = bits.clone()
    other[nan] = 0x7FFF  # another NaN payload at the same positions
    args = dict(
        src_cache=t["src_cache"],
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
    )
    assert matches(gather_rows_flag(dst=other.view(torch.bfloat16), **args))  # NaN by position vs the oracle
    assert not matches(gather_rows_flag(dst=dst, dst2=other.view(torch.bfloat16), **args))  # but the runs differ


@pytest.mark.parametrize("values", [ValueMode.ALL_CODES, ValueMode.NAN, ValueMode.ACTIVATIONS])
@given(seed=st.integers(0, 2**32 - 1), keep=st.integers(1, 2**20))
@settings(max_examples=4, deadline=None)
@pytest.mark.slow
def test_a_prefilled_dst_is_a_match_only_once_every_byte_of_it_is_written(values, seed, keep):
    """The one-run write map: after gather_prefill, a dst where a kernel wrote every byte with the
    oracle's value matches; leave any byte (of any element, NaN ones included) unwritten and it
    does not."""
    from mlafuzz.harness.fast.gather import gather_prefill

    spec = GatherSpec(
        requests=(
            GatherRequest(context_len=30, seq_start=4, length=17),
            GatherRequest(context_len=0),
            GatherRequest(context_len=11),
        ),
        paging=Paging(block_size=8, layout="shuffled"),
        values=values,
        ws_form="cumulative",
    )
    case = materialize(spec, seed, DEV)
    t = case.tensors
    args = dict(
        src_cache=t["src_cache"],
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
    )
    expected = _expected(case)
    dst = torch.empty_like(expected)
    assert gather_prefill(dst=dst, **args)
    assert not _match(case, dst)
    fill, want = dst.view(torch.uint8), expected.view(torch.uint8)
    assert bool((fill != want).all()) or bool(torch.isnan(expected).any())  # only NaN elements may share a byte
    written = fill.clone()
    written.copy_(want)
    assert _match(case, written.view(torch.bfloat16))
    # Leave some bytes as the fill left them: a byte of a NaN element, and bytes anywhere.
    flat = written.reshape(-1)
    nan_bytes = torch.isnan(expected).repeat_interleave(2, dim=1).reshape(-1).nonzero().reshape(-1)
    candidates = [int(keep % flat.numel())] + ([int(nan_bytes[keep % nan_bytes.numel()])] if nan_bytes.numel() else [])
    for i in candidates:
        partial = flat.clone()
        partial[i] = fill.reshape(-1)[i]
        assert not _match(case, partial.view(torch.bfloat16).reshape(expected.shape)), i


@given(
    seed=st.integers(0, 2**32 - 1),
    reqs=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 9)), min_size=1, max_size=7),
    bs=st.sampled_from([1, 3, 16, 64]),
    ws_form=st.sampled_from(["cumulative", "exact"]),
)
@settings(max_examples=12, deadline=None)
def test_the_one_launch_row_to_record_map_is_the_oracles(seed, reqs, bs, ws_form):
    """record_offsets (a binary search per row, in the fused check's kernel language) against
    oracles.gather.row_records (torch.searchsorted): empty requests, seq_starts, any block size."""
    from mlafuzz.harness.fast.gather import record_offsets

    requests = tuple(
        GatherRequest(context_len=ctx, seq_start=min(start, ctx), length=ctx - min(start, ctx)) for ctx, start in reqs
    )
    spec = GatherSpec(requests=requests, paging=Paging(block_size=bs, layout="shuffled"), ws_form=ws_form)
    case = materialize(spec, seed, DEV)
    t, p = case.tensors, case.params
    args = dict(
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=p["batch_size"],
        seq_starts=t["seq_starts"],
        total=p["total"],
    )
    block, entry = og.row_records(block_size=bs, device=t["src_cache"].device, **args)
    assert torch.equal(record_offsets(src_cache=t["src_cache"], **args), (block * bs + entry) * 656)


@triton.jit
def _probe_pairs(e_ptr, a_ptr, bad_ptr, unlike_ptr, nan_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    e = tl.load(e_ptr + offs, mask=m, other=0)
    a = tl.load(a_ptr + offs, mask=m, other=0)
    tl.store(bad_ptr + offs, _bad_pairs(e, a).to(tl.int32), mask=m)
    tl.store(unlike_ptr + offs, _unlike_pairs(e), mask=m)
    tl.store(nan_ptr + offs, _nan_halves(e), mask=m)


def _pairs_probe(e: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed helpers of the fused check on element pairs e (expected) and a (actual)."""
    n = e.size
    et = torch.from_numpy(e.astype(np.uint32).view(np.int32)).to(DEV).view(torch.uint32)
    at = torch.from_numpy(a.astype(np.uint32).view(np.int32)).to(DEV).view(torch.uint32)
    bad = torch.empty(n, dtype=torch.int32, device=DEV)
    unlike = torch.empty_like(et)
    nan = torch.empty_like(et)
    block = 4096
    _probe_pairs[(triton.cdiv(n, block),)](et, at, bad, unlike, nan, n, BLOCK=block)
    as_np = lambda t: t.view(torch.int32).cpu().numpy().view(np.uint32)  # noqa: E731
    return bad.cpu().numpy() != 0, as_np(unlike), as_np(nan)


def _is_nan16(h: np.ndarray) -> np.ndarray:
    return (h & 0x7FFF) > 0x7F80


def _no_match16(e: np.ndarray, a: np.ndarray) -> np.ndarray:
    """SPEC's comparison of one bf16 element, spelled on 16-bit patterns: NaN by position."""
    return np.where(_is_nan16(e), ~_is_nan16(a), e != a)


def test_the_packed_pair_helpers_agree_with_the_elementwise_rule_on_every_pattern():
    """Every 16-bit pattern in each half: the NaN test, and "no match" against the actual value
    equal, off by one bit, a NaN of another payload, or random."""
    gen = np.random.default_rng(0)
    lo = np.arange(65536, dtype=np.uint32)
    hi = gen.permutation(65536).astype(np.uint32)
    e = (hi << 16) | lo
    _, _, nan = _pairs_probe(e, e)
    assert np.array_equal((nan >> 15) & 1, _is_nan16(lo)) and np.array_equal(nan >> 31, _is_nan16(hi))
    for a in (
        e,
        e ^ 0x00010000,
        e ^ 0x00000001,
        e ^ 0x80008000,
        (e & 0xFFC0FFC0) | 0x7F817F81,
        gen.integers(0, 2**32, e.size, dtype=np.uint64).astype(np.uint32),
        e ^ 0x00400040,
    ):
        bad, _, _ = _pairs_probe(e, a)
        truth = _no_match16(lo, a & 0xFFFF) | _no_match16(hi, a >> 16)
        assert np.array_equal(bad, truth)


def test_an_unlike_prefill_is_no_match_while_any_byte_of_an_element_is_left_unwritten():
    """For every expected pattern in each half: the fill alone, and the fill with either byte of
    an element (or of both elements) replaced by the expected byte, are no match; the expected
    pair itself is one."""
    gen = np.random.default_rng(1)
    lo = np.arange(65536, dtype=np.uint32)
    hi = gen.permutation(65536).astype(np.uint32)
    e = (hi << 16) | lo
    _, fill, _ = _pairs_probe(e, e)
    assert not _pairs_probe(e, e)[0].any()
    for keep_from_expected in (
        0x00000000,
        0x000000FF,
        0x0000FF00,
        0x00FF0000,
        0xFF000000,
        0x00FF00FF,
        0xFF00FF00,
        0xFFFF0000,
        0x0000FFFF,
    ):
        mixed = (e & keep_from_expected) | (fill & ~np.uint32(keep_from_expected))
        bad, _, _ = _pairs_probe(e, mixed)
        assert bad.all(), hex(keep_from_expected)
