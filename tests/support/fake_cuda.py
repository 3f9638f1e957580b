"""A stand-in for the CUDA runtime's last-error slot, so the LAUNCH_ERROR logic runs on the CPU.

``FakeRuntime.install(monkeypatch)`` routes ``cuda_errors.take_pending`` to the fake: it reads and
clears what a planted implementation left with ``leave`` (as cudaGetLastError reads and clears the
real one), on any device, and counts how often the harness asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from mlafuzz.harness.memory import cuda_errors
from mlafuzz.kernels.torch_impl import check_writer_call, writer_torch

ZERO_GRID = "CUDA error 9: invalid configuration argument"


@dataclass
class FakeRuntime:
    pending: str | None = None
    asked: int = 0
    taken: list[str] = field(default_factory=list)

    def leave(self, error: str) -> None:
        self.pending = error

    def take_pending(self, device: str) -> str | None:
        self.asked += 1
        error, self.pending = self.pending, None
        if error is not None:
            self.taken.append(error)
        return error

    def install(self, monkeypatch: Any) -> FakeRuntime:
        monkeypatch.setattr(cuda_errors, "take_pending", self.take_pending)
        return self

    def zero_grid_writer(self) -> Callable[..., None]:
        """vLLM's writer as issue 16 found it: its host checks, then on zero tokens a launch that
        fails, unchecked."""

        def writer(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None):
            check_writer_call(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)
            if slot_mapping.shape[0] == 0:
                self.leave(ZERO_GRID)
                return
            writer_torch(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)

        return writer
