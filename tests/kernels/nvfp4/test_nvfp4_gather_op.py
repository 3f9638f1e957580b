"""The nvfp4_gather op (SPEC 11.2): our gathers equal the exact reader bit for bit over drawn cases,
the drawn records hold what the brief promises, and the unwritten scale class is judged on NaN-ness
and sign alone."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.generators.ops.gather import GatherRequest
from mlafuzz.generators.ops.nvfp4_gather import Nvfp4GatherSpec, Nvfp4Values
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.nvfp4.torch_gather import gather_nvfp4_torch
from mlafuzz.reports.findings import Kind
from mlafuzz.tests.support.cuda_cases import gpu
from mlafuzz.tests.support.helpers import cpu_mutants, draw_spec, materialize, resolve, run_case

OP = OPS.get("nvfp4_gather")


def _cases(n: int, *, device: str = "cpu"):
    for seed in range(n):
        yield materialize(draw_spec("nvfp4_gather", seed=seed), seed, device)


def test_our_torch_gather_is_clean_over_40_drawn_cases_of_both_scale_classes():
    entry = resolve("nvfp4_gather", "torch")
    classes = set()
    for case in _cases(40):
        classes.add(case.spec.values)
        assert run_case(case=case, entry=entry).findings == (), case.spec
    assert classes == set(Nvfp4Values)


def test_drawn_records_hold_every_code_and_rope_byte_and_written_scales_only_01_to_7e():
    spec = Nvfp4GatherSpec(requests=(GatherRequest(context_len=4096, length=4096),))
    cache = materialize(spec, 3).tensors["src_cache"].reshape(-1, 352)
    codes = torch.cat([cache[:, :256] & 0xF, cache[:, :256] >> 4])
    assert set(codes.unique().tolist()) == set(range(16))
    assert set(cache[:, 256:320].unique().tolist()) == set(range(256))
    assert set(cache[:, 320:].unique().tolist()) == set(range(1, 0x7F))
    loose = materialize(Nvfp4GatherSpec(requests=spec.requests, values="unwritten"), 3).tensors["src_cache"]
    scales = set(loose.reshape(-1, 352)[:, 320:].unique().tolist())
    assert {0x00, 0x7F, 0xFF} <= scales and any(0x80 <= s < 0xFF for s in scales)


def test_a_case_is_the_same_bytes_from_its_spec_and_seed():
    spec = draw_spec("nvfp4_gather", seed=11)
    a, b = materialize(spec, 11), materialize(spec, 11)
    assert (
        all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors if a.tensors[k] is not None)
        and a.params == b.params
    )


def _unwritten_case():
    spec = Nvfp4GatherSpec(requests=(GatherRequest(context_len=64, length=64),), values="unwritten")
    return materialize(spec, 5)


def _reader(change):
    """Our torch gather, with ``change(dst, loose)`` applied to its output afterwards."""

    def fn(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
        gather_nvfp4_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
        case = _unwritten_case()
        change(dst, OP.loose(case)["dst"])

    return fn


def test_unwritten_scales_are_judged_on_nan_and_sign_but_every_other_element_bit_for_bit():
    case = _unwritten_case()
    entry = resolve("nvfp4_gather", "torch")
    assert OP.loose(case)["dst"].any()

    def magnitude(dst, loose):  # another magnitude of the same sign where a loose scale is read
        bits = dst.view(torch.int16)
        finite = loose & ~torch.isnan(dst)
        bits[finite] = (bits[finite] & -0x8000) | 0x3F80

    def sign(dst, loose):
        bits = dst.view(torch.int16)
        bits[loose & ~torch.isnan(dst)] ^= -0x8000

    def written(dst, loose):  # one element read through a written scale, off by one ulp
        where = (~loose).nonzero()[0].tolist()
        dst.view(torch.int16)[where[0], where[1]] += 1

    assert run_case(case=case, entry=entry, fn=_reader(magnitude)).findings == ()
    (f,) = run_case(case=case, entry=entry, fn=_reader(sign)).findings
    assert f.kind is Kind.VALUE_MISMATCH
    (f,) = run_case(case=case, entry=entry, fn=_reader(written)).findings
    assert f.kind is Kind.VALUE_MISMATCH and f.count == 1


def test_our_cuda_gather_refuses_cpu_tensors_and_fp8_records_before_any_build():
    from mlafuzz.kernels.checks import InvalidInputError
    from mlafuzz.kernels.nvfp4 import cuda_gather as nvfp4_cuda

    args = (torch.zeros(1, 576, dtype=torch.bfloat16), torch.zeros(1, 1, dtype=torch.int32))
    ws = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        nvfp4_cuda.gather(torch.zeros(1, 1, 352, dtype=torch.uint8), *args, ws, 1)
    with pytest.raises(InvalidInputError, match="352"):
        gather_nvfp4_torch(torch.zeros(1, 1, 656, dtype=torch.uint8), *args, ws, 1)


@gpu
@pytest.mark.parametrize("force_scalar", [False, True])
def test_our_cuda_gather_equals_the_exact_reader_over_60_drawn_cases(force_scalar):
    import functools

    from mlafuzz.kernels.nvfp4 import cuda_gather as nvfp4_cuda

    entry = resolve("nvfp4_gather", "cuda")
    fn = functools.partial(nvfp4_cuda.gather_impl, force_scalar=force_scalar)
    for case in _cases(60, device="cuda"):
        assert run_case(case=case, entry=entry, fn=fn, rerun=True).findings == (), case.spec


@gpu
def test_our_torch_gather_is_clean_on_cuda_over_40_drawn_cases():
    entry = resolve("nvfp4_gather", "torch")
    for case in _cases(40, device="cuda"):
        assert run_case(case=case, entry=entry).findings == (), case.spec


@gpu
def test_our_cuda_gather_is_the_oracle_at_deepseeks_shape():
    entry = resolve("nvfp4_gather", "cuda")
    case = materialize(OP.bench.realistic(), 1, "cuda")
    assert run_case(case=case, entry=entry).findings == ()


def test_each_nvfp4_gather_mutant_is_killed_with_its_kind_on_the_cpu(tmp_path):
    results, clean = cpu_mutants("nvfp4_gather", cases=40, out=tmp_path)
    names = {"identity_scales", "swapped_nibbles", "fp8_stride", "staging_clip"}
    assert {r.name for r in results} == {f"nvfp4_gather_{n}" for n in names} and clean == []
    assert all(r.killed and r.found == ("VALUE_MISMATCH",) for r in results), results
