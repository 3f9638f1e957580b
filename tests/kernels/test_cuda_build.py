"""The CUDA fp8_ds_mla kernels' build and host-side behaviour, on any machine.

The kernels and their torch binding compile with nvcc for sm_90 without a GPU, and the wrappers
refuse bad calls before touching CUDA. The GPU tests are test_kernels_cuda_gather.py and
test_kernels_cuda_writer.py.
"""

from __future__ import annotations

import time

import pytest
import torch

from mlafuzz.kernels import cuda_ext
from mlafuzz.tests.support.cuda_cases import HAS_CUDA

# ----------------------------------------------------------------------------- CPU tests


@pytest.mark.slow
def test_kernels_and_their_torch_binding_compile_for_sm90_without_a_gpu(tmp_path):
    """kernels.cu (no torch header) and ops.cpp (the torch ops) compile for sm_90 on a machine
    without a GPU, and the binding calls the launchers the kernels define."""
    if cuda_ext._find_nvcc() is None:
        pytest.skip("nvcc not found: no CUDA toolkit on this machine (CI installs one)")
    t0 = time.perf_counter()
    kernels_obj, ops_obj = cuda_ext.nvcc_compile_check(out_dir=tmp_path)
    seconds = time.perf_counter() - t0
    kernels, ops = kernels_obj.read_bytes(), ops_obj.read_bytes()
    for kernel in (
        b"gather_vec_kernel",
        b"gather_scalar_kernel",
        b"writer_kernel",
        b"nvfp4_gather_vec_kernel",
        b"nvfp4_gather_scalar_kernel",
    ):
        assert kernel in kernels, f"{kernel!r} missing from {kernels_obj}"
    for launcher in (b"launch_gather", b"launch_writer", b"launch_nvfp4_gather"):
        assert launcher in kernels and launcher in ops, launcher
    assert cuda_ext.EXTENSION_NAME.encode() in ops  # TORCH_LIBRARY's namespace
    assert b"c10" not in kernels  # the kernels' unit includes no torch header: that is its speed
    print(f"compile check: {seconds:.1f} s -> {kernels_obj.name} ({len(kernels)} bytes), {ops_obj.name}")


def test_writer_rejects_other_kv_cache_dtype():
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        cuda_ext.writer(
            x,
            x[:, :64],
            torch.zeros(1, 1, 656, dtype=torch.uint8),
            torch.zeros(1, dtype=torch.int64),
            kv_cache_dtype="auto",
        )


def test_wrappers_refuse_cpu_tensors():
    cache = torch.zeros(1, 1, 656, dtype=torch.uint8)
    with pytest.raises(ValueError, match="CUDA"):
        cuda_ext.gather(
            cache,
            torch.zeros(1, 576, dtype=torch.bfloat16),
            torch.zeros(1, 1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            1,
        )
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        cuda_ext.writer(x, x[:, :64], cache, torch.zeros(1, dtype=torch.int64))


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU error path")
def test_load_extension_without_cuda_is_a_one_line_error():
    with pytest.raises(RuntimeError, match="no CUDA device") as err:
        cuda_ext.load_extension()
    assert "\n" not in str(err.value)


def test_build_key_depends_on_arch_and_flags():
    assert cuda_ext._build_key("sm_90") != cuda_ext._build_key("sm_100")
    flags = cuda_ext.nvcc_flags("sm_90")
    assert "-gencode=arch=compute_90,code=sm_90" in flags
    assert "-ftz=false" in flags and "-prec-div=true" in flags
    assert not any("fast_math" in f or "fast-math" in f for f in flags)
