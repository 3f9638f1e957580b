"""Fast OOB detection for outputs an implementation allocates itself (convert's ``out``).

Installs a red-zone allocator (harness/csrc/redzone_alloc.cpp) through
``torch.cuda.memory.CUDAPluggableAllocator``: every CUDA allocation gets 4 KiB
of canary on each side and ends exactly at its requested size. After each
call the harness checks every live block's canaries; a changed canary is an
OOB_WRITE naming the allocation (and the output tensor when it is one).

The allocator is process-wide by nature, so it is installed once per worker
process, before that process allocates any CUDA memory.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).parent / "csrc" / "redzone_alloc.cpp"


@dataclass(frozen=True, kw_only=True)
class Violation:
    ptr: int
    size: int
    side: str  # "before" | "after"
    offset: int  # bytes between the region and the nearest changed canary byte
    count: int


def cache_dir() -> Path:
    return Path(os.environ.get("MLAFUZZ_CACHE", Path.home() / ".cache" / "mlafuzz"))


def build(*, nvcc: str | None = None) -> Path:
    """Compile the allocator to a shared library (cached by source hash)."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("the red-zone allocator needs nvcc on PATH")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    out = cache_dir() / f"redzone-{digest}" / "libmlafuzz_redzone.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        # A temporary name of this process's own: builds running at once (the workers of a run,
        # or runs side by side) must not write, rename or load one another's half-written file.
        tmp = out.with_suffix(f".{os.getpid()}.tmp.so")
        subprocess.run(
            [nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", "-o", str(tmp), str(SOURCE), "-lcudart"],
            check=True,
            capture_output=True,
            text=True,
        )
        tmp.replace(out)
    return out


class RedZone:
    def __init__(self, lib_path: Path) -> None:
        import torch

        alloc = torch.cuda.memory.CUDAPluggableAllocator(str(lib_path), "mlafuzz_rz_malloc", "mlafuzz_rz_free")
        torch.cuda.memory.change_current_allocator(alloc)
        self._lib = ctypes.CDLL(str(lib_path))  # same handle as the allocator's dlopen: same globals
        self._lib.mlafuzz_rz_check_all.restype = ctypes.c_int
        self._lib.mlafuzz_rz_take_report.restype = ctypes.c_long
        self._lib.mlafuzz_rz_take_report.argtypes = [ctypes.c_char_p, ctypes.c_long]

    def check(self) -> list[Violation]:
        """Violations since the last check (the zones are re-armed)."""
        self._lib.mlafuzz_rz_check_all()
        n = self._lib.mlafuzz_rz_take_report(None, 0)
        if n <= 0:
            return []
        buf = ctypes.create_string_buffer(n + 1)
        self._lib.mlafuzz_rz_take_report(buf, n + 1)
        out = []
        for line in buf.value.decode().splitlines():
            ptr, size, side, offset, count = line.split()
            out.append(Violation(ptr=int(ptr, 16), size=int(size), side=side, offset=int(offset), count=int(count)))
        return out


_ACTIVE: list[RedZone] = []  # at most one: the allocator of this process


def install() -> RedZone:
    if not _ACTIVE:
        _ACTIVE.append(RedZone(build()))
    return _ACTIVE[0]


def active() -> RedZone | None:
    return _ACTIVE[0] if _ACTIVE else None
