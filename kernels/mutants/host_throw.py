"""The planted crash of a C++ host check: ``gather_cpp_throw``.

A gather whose host-side dtype check is C++ (csrc/host_check.cpp, called
through ctypes) and throws when dst is not bf16. The exception cannot cross the
check's noexcept boundary, so the process aborts, as vLLM's gather did on the
H200 image whenever its TORCH_CHECK threw (there: SIGSEGV). On valid inputs it
is our gather: the torch one on the CPU, the CUDA kernel on the GPU, so a run
of it is a run of ours plus one crash-prone error-input class (``wrong_dtype``).

The library is compiled with g++ on first load, cached by source digest
under $MLAFUZZ_CACHE (no torch headers, about a second).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import torch

SOURCE = Path(__file__).parent / "csrc" / "host_check.cpp"
# c10::ScalarType's numbers, as a C++ check would compare them.
DTYPE_CODES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}
BF16 = DTYPE_CODES[torch.bfloat16]


COMPILER = "g++"


def compiler() -> str | None:
    """The path of the C++ compiler this mutant is built with, or None when there is none."""
    return shutil.which(COMPILER)


def _cache_root() -> Path:
    env = os.environ.get("MLAFUZZ_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mlafuzz"


def build() -> Path:
    """The shared library, compiled now unless a build of this very source is cached. Concurrent
    workers may build at once: each writes its own temporary file and renames it into place."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(f"gather_cpp_throw needs a C++ compiler: {COMPILER} is not on PATH")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    out = _cache_root() / f"host-check-{digest}" / "libmlafuzz_host_check.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        proc = subprocess.run(
            [cxx, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            first = (proc.stderr.strip().splitlines() or ["no output"])[0]
            raise RuntimeError(f"gather_cpp_throw: {cxx} failed to build {SOURCE.name}: {first}")
        tmp.replace(out)
    return out


@functools.cache
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    lib.mlafuzz_mutant_check_dst_dtype.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.mlafuzz_mutant_check_dst_dtype.restype = None
    return lib


def gather_cpp_throw(device: str) -> Callable[..., None]:
    """The mutant for ``device`` ('cpu' or 'cuda'): the C++ check, then our gather there."""
    check = _library().mlafuzz_mutant_check_dst_dtype
    if device == "cuda":
        from mlafuzz.kernels.cuda_ext import gather as inner
    else:
        from mlafuzz.kernels.torch_impl import gather_torch as inner

    def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None) -> None:
        check(DTYPE_CODES.get(getattr(dst, "dtype", None), -1), BF16)  # aborts the process unless bf16
        inner(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)

    return gather
