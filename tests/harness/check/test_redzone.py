"""The red-zone allocator (--redzone) builds with nvcc and exports what CUDAPluggableAllocator loads."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

from mlafuzz.harness.memory import redzone


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (present on CI and the GPU image)")
def test_allocator_library_builds_and_exports_the_allocator_entry_points(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAFUZZ_CACHE", str(tmp_path))
    lib_path = redzone.build()
    assert lib_path.is_file() and lib_path.parent.parent == tmp_path
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as exc:  # libcudart missing at run time on a machine without CUDA libraries
        pytest.skip(f"built, but cannot be loaded here: {exc}")
    for name in ("mlafuzz_rz_malloc", "mlafuzz_rz_free", "mlafuzz_rz_check_all", "mlafuzz_rz_take_report"):
        assert hasattr(lib, name)
    assert redzone.build() == lib_path  # cached by source hash


@pytest.mark.gpu
def test_a_write_past_an_allocation_is_reported_with_its_side_and_distance():
    pytest.importorskip("cupy")
    import subprocess
    import sys

    # The allocator must be installed before the process's first CUDA allocation: use a fresh process.
    code = (
        "import torch\n"
        "from mlafuzz.harness.memory import redzone\n"
        "rz = redzone.install()\n"
        "t = torch.zeros(100, dtype=torch.int32, device='cuda')\n"
        "assert rz.check() == []\n"
        "import cupy\n"
        "cupy.cuda.runtime.memset(t.data_ptr() + 404, 7, 4)  # 4 bytes, 4 bytes past the end\n"
        "torch.cuda.synchronize()\n"
        "(v,) = rz.check()\n"
        "assert v.ptr == t.data_ptr() and v.side == 'after' and v.offset == 4 and v.count == 4, v\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
    assert torch is not None
