"""The Triton convert kernel (SPEC §3) against the convert oracle.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors; the
variable must be set before triton is imported (it is read at @triton.jit
decoration time).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips
from hypothesis import HealthCheck, given, settings  # noqa: E402

from mlafuzz.kernels import triton_convert  # noqa: E402
from mlafuzz.kernels.checks import CONVERT_REJECTS, InvalidInputError  # noqa: E402
from mlafuzz.kernels.triton_convert import convert, pick_tile  # noqa: E402
from mlafuzz.oracles.convert import convert as oracle_convert  # noqa: E402
from mlafuzz.tests.support.convert_inputs import build_inputs, convert_cases  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.gpu


def reference_convert(req_id, block_table, token_indices, block_size, prefill_ids=None, prefill_starts=None):
    """(out, valid_counts) from the oracle, as int64 CPU tensors."""
    out, counts = oracle_convert(
        req_id=req_id,
        block_table=block_table,
        token_indices=token_indices,
        block_size=block_size,
        has_prefill_workspace=prefill_ids is not None,
        prefill_workspace_request_ids=prefill_ids,
        prefill_workspace_starts=prefill_starts,
    )
    return out.cpu().long(), counts.cpu().long()


# ------------------------------------------------------------------ inputs


def run_convert(c, req, bt, ti, ids, starts, fn=convert):
    return fn(
        req,
        bt,
        ti,
        BLOCK_SIZE=c["block_size"],
        NUM_TOPK_TOKENS=c["k"],
        BLOCK_N=c["block_n"],
        HAS_PREFILL_WORKSPACE=c["prefill"],
        prefill_workspace_request_ids=ids,
        prefill_workspace_starts=starts,
        return_valid_counts=c["counts"],
    )


# ------------------------------------------------------------------ values


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convert_cases())
def test_convert_matches_reference_on_drawn_inputs(c):
    req, bt, ti, ids, starts = build_inputs(c, DEVICE)
    got = run_convert(c, req, bt, ti, ids, starts)
    want_out, want_counts = reference_convert(req, bt, ti, c["block_size"], ids, starts)
    out = got[0] if c["counts"] else got
    assert out.dtype == torch.int32 and out.shape == (c["n"], c["k"]) and out.is_contiguous()
    assert torch.equal(out.cpu().long(), want_out)
    if c["counts"]:
        assert got[1].dtype == torch.int32 and got[1].shape == (c["n"],)
        assert torch.equal(got[1].cpu().long(), want_counts)


@pytest.mark.parametrize("counts", [False, True])
def test_convert_with_zero_rows_returns_empty_without_launch(monkeypatch, counts):
    monkeypatch.setattr(triton_convert, "_convert_kernel", _NoLaunch())
    req = torch.empty(0, dtype=torch.int32)
    got = convert(
        req,
        torch.zeros((2, 3), dtype=torch.int32),
        torch.empty((0, 256), dtype=torch.int32),
        NUM_TOPK_TOKENS=256,
        return_valid_counts=counts,
    )
    out = got[0] if counts else got
    assert out.shape == (0, 256) and out.dtype == torch.int32
    if counts:
        assert got[1].shape == (0,) and got[1].dtype == torch.int32


def test_convert_only_minus_one_and_every_negative_are_invalid():
    ti = torch.tensor([[-1, -2, -(2**31), 0, 63, 64, 127, 128] * 16], dtype=torch.int32, device=DEVICE)
    bt = torch.tensor([[7, 9]], dtype=torch.int32, device=DEVICE)
    out, counts = convert(
        torch.zeros(1, dtype=torch.int32, device=DEVICE), bt, ti, NUM_TOPK_TOKENS=128, return_valid_counts=True
    )
    assert out[0, :8].tolist() == [-1, -1, -1, 448, 511, 576, 639, -1]
    assert counts.tolist() == [16 * 4]


def test_convert_prefill_rows_use_workspace_and_still_check_the_table_bound():
    # Row 0 is a decode row, row 1 a prefill row of workspace request 1.
    ti = torch.tensor([[5, 70, 200, -3] * 32, [5, 70, 200, -3] * 32], dtype=torch.int32, device=DEVICE)
    # 3 blocks of 64: token 200 is past the table.
    bt = torch.tensor([[2, 3, 4]], dtype=torch.int32, device=DEVICE)
    out, counts = convert(
        torch.zeros(2, dtype=torch.int32, device=DEVICE),
        bt,
        ti,
        NUM_TOPK_TOKENS=128,
        HAS_PREFILL_WORKSPACE=True,
        prefill_workspace_request_ids=torch.tensor([-1, 1], dtype=torch.int32, device=DEVICE),
        prefill_workspace_starts=torch.tensor([0, 1000], dtype=torch.int32, device=DEVICE),
        return_valid_counts=True,
    )
    assert out[0, :4].tolist() == [2 * 64 + 5, 3 * 64 + 6, -1, -1]
    assert out[1, :4].tolist() == [1005, 1070, -1, -1]
    assert counts.tolist() == [64, 64]


def test_convert_out_of_range_request_or_workspace_id_reads_nothing_and_gives_minus_one():
    """Documented extension: out-of-contract ids never read out of bounds."""
    ti = torch.arange(128, dtype=torch.int32, device=DEVICE).repeat(3, 1)
    bt = torch.tensor([[1, 2]], dtype=torch.int32, device=DEVICE)
    out = convert(
        torch.tensor([5, -1, 0], dtype=torch.int32, device=DEVICE),
        bt,
        ti,
        NUM_TOPK_TOKENS=128,
        HAS_PREFILL_WORKSPACE=True,
        prefill_workspace_request_ids=torch.tensor([-1, -1, 4], dtype=torch.int32, device=DEVICE),
        prefill_workspace_starts=torch.tensor([10], dtype=torch.int32, device=DEVICE),
    )
    assert (out == -1).all()


@pytest.mark.skipif(not triton_convert.INTERPRETED, reason="the module was compiled, not interpreted")
def test_convert_interpreted_accepts_cpu_tensors():
    out = convert(
        torch.zeros(1, dtype=torch.int32),
        torch.zeros((1, 1), dtype=torch.int32),
        torch.zeros((1, 128), dtype=torch.int32),
        NUM_TOPK_TOKENS=128,
    )
    assert out.device.type == "cpu" and (out == 0).all()


@pytest.mark.skipif(triton_convert.INTERPRETED, reason="needs the compiled kernel")
def test_convert_compiled_rejects_cpu_tensors_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(triton_convert, "_convert_kernel", _NoLaunch())
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        convert(
            torch.zeros(1, dtype=torch.int32),
            torch.zeros((1, 1), dtype=torch.int32),
            torch.zeros((1, 128), dtype=torch.int32),
            NUM_TOPK_TOKENS=128,
        )


def test_convert_wide_block_n_and_tile_choice():
    assert pick_tile(2048, 128) == 2048
    assert pick_tile(384, 128) == 128
    assert pick_tile(768, 256) == 256
    assert pick_tile(4096, 4096) == 4096
    c = dict(
        n=3,
        k=384,
        block_n=128,
        block_size=16,
        num_reqs=2,
        max_blocks=4,
        prefill=False,
        num_starts=1,
        counts=True,
        strided=False,
        seed=3,
    )
    req, bt, ti, ids, starts = build_inputs(c, DEVICE)
    out, counts = run_convert(c, req, bt, ti, ids, starts)
    want_out, want_counts = reference_convert(req, bt, ti, 16)
    assert torch.equal(out.cpu().long(), want_out) and torch.equal(counts.cpu().long(), want_counts)


def test_convert_does_not_modify_its_inputs():
    c = dict(
        n=4,
        k=128,
        block_n=64,
        block_size=16,
        num_reqs=2,
        max_blocks=3,
        prefill=True,
        num_starts=2,
        counts=True,
        strided=True,
        seed=11,
    )
    inputs = build_inputs(c, DEVICE)
    before = [t.clone() for t in inputs]
    run_convert(c, *inputs)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before))


# ---------------------------------------------------------- preconditions


class _NoLaunch:
    """Stands in for the kernel: any launch attempt fails the test."""

    def __getitem__(self, grid):
        raise AssertionError(f"kernel launched with grid={grid}")


def _ok_args(n=2, k=256):
    return dict(
        req_id=torch.zeros(n, dtype=torch.int32),
        block_table=torch.zeros((2, 4), dtype=torch.int32),
        token_indices=torch.zeros((n, k), dtype=torch.int32),
        BLOCK_SIZE=64,
        NUM_TOPK_TOKENS=k,
        BLOCK_N=128,
        HAS_PREFILL_WORKSPACE=False,
        prefill_workspace_request_ids=None,
        prefill_workspace_starts=None,
    )


def _with(**changes):
    a = _ok_args()
    a.update(changes)
    return a


_PREF = dict(
    HAS_PREFILL_WORKSPACE=True,
    prefill_workspace_request_ids=torch.zeros(2, dtype=torch.int32),
    prefill_workspace_starts=torch.zeros(1, dtype=torch.int32),
)

INVALID = {
    "req_id_longer_than_indices": ("length_mismatch", _with(req_id=torch.zeros(3, dtype=torch.int32))),
    "req_id_shorter_than_indices": ("length_mismatch", _with(req_id=torch.zeros(1, dtype=torch.int32))),
    "req_id_int64": ("wrong_dtype", _with(req_id=torch.zeros(2, dtype=torch.int64))),
    "block_table_int64": ("wrong_dtype", _with(block_table=torch.zeros((2, 4), dtype=torch.int64))),
    "token_indices_int64": ("wrong_dtype", _with(token_indices=torch.zeros((2, 256), dtype=torch.int64))),
    "req_id_list": ("wrong_dtype", _with(req_id=[0, 0])),
    "prefill_ids_int64": (
        "wrong_dtype",
        {**_with(**_PREF), "prefill_workspace_request_ids": torch.zeros(2, dtype=torch.int64)},
    ),
    "prefill_starts_int64": (
        "wrong_dtype",
        {**_with(**_PREF), "prefill_workspace_starts": torch.zeros(1, dtype=torch.int64)},
    ),
    "k_not_num_topk": ("k_mismatch", _with(NUM_TOPK_TOKENS=512)),
    "k_not_multiple_of_block_n": (
        "k_not_multiple_of_block_n",
        _with(token_indices=torch.zeros((2, 96), dtype=torch.int32), NUM_TOPK_TOKENS=96, BLOCK_N=64),
    ),
    "block_size_zero": ("bad_block_size", _with(BLOCK_SIZE=0)),
    "block_size_negative": ("bad_block_size", _with(BLOCK_SIZE=-64)),
    "block_size_float": ("bad_block_size", _with(BLOCK_SIZE=64.0)),
    "block_n_zero": ("bad_block_n", _with(BLOCK_N=0)),
    "block_n_not_pow2": ("bad_block_n", _with(BLOCK_N=64 + 32)),
    "req_id_2d": ("wrong_shape", _with(req_id=torch.zeros((2, 1), dtype=torch.int32))),
    "token_indices_1d": ("wrong_shape", _with(token_indices=torch.zeros(256, dtype=torch.int32))),
    "block_table_1d": ("wrong_shape", _with(block_table=torch.zeros(4, dtype=torch.int32))),
    "prefill_ids_wrong_length": (
        "wrong_shape",
        {**_with(**_PREF), "prefill_workspace_request_ids": torch.zeros(3, dtype=torch.int32)},
    ),
    "prefill_ids_missing": ("missing_prefill_args", {**_with(**_PREF), "prefill_workspace_request_ids": None}),
    "prefill_starts_missing": ("missing_prefill_args", {**_with(**_PREF), "prefill_workspace_starts": None}),
    "block_table_other_device": (
        "device_mismatch",
        _with(block_table=torch.zeros((2, 4), dtype=torch.int32, device="meta")),
    ),
}


@pytest.mark.parametrize("counts", [False, True])
@pytest.mark.parametrize("case", sorted(INVALID))
def test_convert_rejects_invalid_input_before_launch(monkeypatch, case, counts):
    reason, args = INVALID[case]
    assert reason in CONVERT_REJECTS
    monkeypatch.setattr(triton_convert, "_convert_kernel", _NoLaunch())
    with pytest.raises((ValueError, TypeError)) as info:
        convert(**args, return_valid_counts=counts)
    assert isinstance(info.value, InvalidInputError) and info.value.reason == reason
    assert "=" in str(info.value)  # name=value style


def test_convert_dtype_errors_are_type_errors():
    with pytest.raises(TypeError):
        convert(**_with(req_id=torch.zeros(2, dtype=torch.int64)))


# ------------------------------------------------------------------ GPU


@gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("prefill", [False, True])
def test_convert_compiled_on_cuda_matches_oracle_at_deepseek_size(prefill):
    n, k, bs, num_reqs, max_blocks = 4096, 2048, 64, 64, 160
    c = dict(
        n=n,
        k=k,
        block_n=128,
        block_size=bs,
        num_reqs=num_reqs,
        max_blocks=max_blocks,
        prefill=prefill,
        num_starts=16,
        counts=True,
        strided=False,
        seed=1234,
    )
    req, bt, ti, ids, starts = build_inputs(c, "cuda")
    out, counts = run_convert(c, req, bt, ti, ids, starts)
    assert out.is_cuda and counts.is_cuda
    # The vectorized oracle runs on the inputs' device: compare every element.
    want_out, want_counts = oracle_convert(
        req_id=req,
        block_table=bt,
        token_indices=ti,
        block_size=bs,
        has_prefill_workspace=prefill,
        prefill_workspace_request_ids=ids,
        prefill_workspace_starts=starts,
    )
    assert torch.equal(out, want_out) and torch.equal(counts, want_counts)
    assert int(counts.sum()) > n * k // 4  # the case is not trivially all -1


@gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_convert_compiled_on_cuda_handles_strided_indices_and_zero_rows():
    c = dict(
        n=257,
        k=512,
        block_n=128,
        block_size=64,
        num_reqs=5,
        max_blocks=9,
        prefill=True,
        num_starts=3,
        counts=True,
        strided=True,
        seed=77,
    )
    req, bt, ti, ids, starts = build_inputs(c, "cuda")
    out, counts = run_convert(c, req, bt, ti, ids, starts)
    ref_out, ref_counts = reference_convert(req, bt, ti, 64, ids, starts)
    assert torch.equal(out.cpu().long(), ref_out) and torch.equal(counts.cpu().long(), ref_counts)
    empty = convert(req[:0], bt, ti[:0], NUM_TOPK_TOKENS=512)
    assert empty.shape == (0, 512)
