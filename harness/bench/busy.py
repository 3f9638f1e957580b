"""How far a fuzz run is from GPU-bound: the GPU's busy fraction, sampled by NVML in a thread.

NVML's utilization rate is the percent of its last sample period (1/6 s to 1 s, by GPU) during
which a kernel ran on the GPU. ``Sampler`` reads it every ``interval`` seconds while the timed
part of ``bench --fuzz`` runs and reports the mean over the samples as the busy fraction.

Sources, first that answers: ``torch.cuda.utilization`` (which needs pynvml / nvidia-ml-py), then
libnvidia-ml.so.1 through ctypes (nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2,
nvmlDeviceGetUtilizationRates: the driver ships it, no package needed). None answering is "n/a"
with the reason, never an error: the bench's cases/s stand on their own.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

Source = Callable[[], float]  # the busy percent of the GPUs now (0..100); raises when it cannot


@dataclass(frozen=True, kw_only=True)
class Busy:
    """A run's busy fraction: ``fraction`` in [0, 1] over ``samples`` readings, or None and why."""

    fraction: float | None
    samples: int = 0
    source: str = ""
    reason: str = ""

    def text(self) -> str:
        if self.fraction is None:
            return f"n/a ({self.reason})"
        return f"{self.fraction:.0%}"


def busy_of(readings: Sequence[float], *, source: str) -> Busy:
    """The mean of the percent readings as a fraction (each clamped to 0..100)."""
    if not readings:
        return Busy(fraction=None, source=source, reason="no sample in the run (too short)")
    clamped = [min(max(float(r), 0.0), 100.0) for r in readings]
    return Busy(fraction=sum(clamped) / len(clamped) / 100.0, samples=len(clamped), source=source)


class Sampler:
    """``with Sampler(source) as s: ...; s.result()``: reads ``source`` every ``interval`` s in a
    daemon thread between enter and exit. A source that raises ends the sampling with its reason."""

    def __init__(self, source: Source | None, *, name: str = "", reason: str = "", interval: float = 0.1) -> None:
        self._source, self._name, self._reason, self._interval = source, name, reason, interval
        self._readings: list[float] = []
        self._error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        assert self._source is not None
        while True:  # one reading at least, however short the run
            try:
                self._readings.append(float(self._source()))
            except Exception as exc:  # a lost GPU or driver: say so, stop asking
                self._error = f"{self._name}: {type(exc).__name__}: {exc}"
                return
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> Sampler:
        if self._source is not None:
            self._thread = threading.Thread(target=self._run, name="mlafuzz-busy", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def result(self) -> Busy:
        if self._source is None:
            return Busy(fraction=None, reason=self._reason or "no source")
        if self._error and not self._readings:
            return Busy(fraction=None, source=self._name, reason=self._error)
        return busy_of(self._readings, source=self._name)


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def _nvml_source(indices: Sequence[int]) -> Source:
    """The mean GPU utilization of the physical GPUs ``indices`` (NVML's numbering), via ctypes."""
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    if lib.nvmlInit_v2() != 0:
        raise RuntimeError("nvmlInit_v2 failed")
    handles = []
    for i in indices:
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(handle)) != 0:
            raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2({i}) failed")
        handles.append(handle)

    def read() -> float:
        total = 0
        for handle in handles:
            rates = _Utilization()
            rc = lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates))
            if rc != 0:
                raise RuntimeError(f"nvmlDeviceGetUtilizationRates returned {rc}")
            total += rates.gpu
        return total / len(handles)

    read()
    return read


def gpu_source(devices: Sequence[str]) -> tuple[Source | None, str, str]:
    """(source, its name, why there is none) for the CUDA devices among ``devices``."""
    indices = sorted({int(d.partition(":")[2] or 0) for d in devices if d.startswith("cuda")})
    if not indices:
        return None, "", "not a GPU run"
    reasons = []
    try:
        import torch

        torch.cuda.utilization(indices[0])  # raises without pynvml

        def via_torch() -> float:
            return sum(torch.cuda.utilization(i) for i in indices) / len(indices)

        return via_torch, "torch.cuda.utilization", ""
    except Exception as exc:
        reasons.append(f"torch.cuda.utilization: {type(exc).__name__}")
    try:
        # torch numbers the visible GPUs; NVML all of them. Map through their PCI bus ids.
        physical = _physical_indices(indices)
        return _nvml_source(physical), "libnvidia-ml.so.1", ""
    except Exception as exc:
        reasons.append(f"libnvidia-ml.so.1: {type(exc).__name__}: {exc}")
    return None, "", "; ".join(reasons)


def _physical_indices(indices: Sequence[int]) -> list[int]:
    """NVML's indices of torch's visible GPUs ``indices`` (CUDA_VISIBLE_DEVICES renumbers them)."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible:
        return list(indices)
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if all(p.isdigit() for p in parts):
        return [int(parts[i]) for i in indices]
    raise RuntimeError("CUDA_VISIBLE_DEVICES names GPUs by UUID: cannot map them to NVML indices")


def sample_gpu(devices: Sequence[str], *, interval: float = 0.1) -> Sampler:
    """A Sampler of the busy fraction of the GPUs ``devices`` run on (n/a, with why, if none)."""
    source, name, reason = gpu_source(devices)
    return Sampler(source, name=name, reason=reason, interval=interval)
