"""CUDA errors an implementation's call left pending, read before any harness op meets them.

A kernel launch that fails its configuration (a zero-size grid, too many
threads) sets the CUDA runtime's last error and returns; an implementation that
never checks it returns normally. The next CUDA call that does check, anywhere
in the process, then raises it: with nothing to catch it, a harness ``clone()``
blamed itself ("harness error") for vLLM's writer on zero tokens. So after
every call of an implementation on CUDA the harness takes the last error
itself: ``cudaGetLastError`` of the process's own CUDA runtime, through ctypes
(no device sync, a microsecond). It reads and clears the error, as any later
checker would have.

Where the runtime library cannot be found (a static build), a one-element
torch fill stands in: its launch check raises what is pending.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path


@functools.cache
def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime this process has loaded (torch's): the same library, the same last error."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "libcudart" in line and "/" in line})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.cudaGetLastError.restype = ctypes.c_int
            lib.cudaGetErrorString.restype = ctypes.c_char_p
            lib.cudaGetErrorString.argtypes = [ctypes.c_int]
            return lib
        except (OSError, AttributeError):
            continue
    return None


def take_pending(device: str) -> str | None:
    """The CUDA error pending in this thread after a call on ``device``, cleared (as any later
    launch check would have cleared it), or None; always None off CUDA. Never raises."""
    if not device.startswith("cuda"):
        return None
    lib = _cudart()
    if lib is not None:
        code = lib.cudaGetLastError()
        if code == 0:
            return None
        name = lib.cudaGetErrorString(code)
        return f"CUDA error {code}: {name.decode() if name else 'unknown'}"
    return _probe()


def _probe() -> str | None:
    import torch

    try:
        torch.zeros(1, device="cuda")  # its launch check raises a pending error
        return None
    except Exception as exc:  # torch.AcceleratorError / RuntimeError
        text = str(exc).strip().splitlines()
        return text[0] if text else type(exc).__name__


def looks_like_cuda_error(exc: BaseException) -> bool:
    """An exception raised by a CUDA runtime call (as torch words them)."""
    name = type(exc).__name__
    return name == "AcceleratorError" or "CUDA error" in str(exc) or "cudaError" in str(exc)


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's CUDA allocator could not find the memory (OutOfMemoryError, by name: no torch
    import here, and a CPU build has the class too)."""
    return type(exc).__name__ == "OutOfMemoryError"
