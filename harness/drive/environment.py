"""The process environment a run needs, decided once at an entry point (CLI, pytest plugin)
before anything imports triton or our Triton modules.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, that is when the
module defining it is first imported: set later, it changes nothing, and a CPU
run then calls compiled kernels on CPU tensors. So the entry points call
``prepare(device)`` first. Spawned workers inherit the environment.
"""

from __future__ import annotations

import os
import sys

INTERPRET = "TRITON_INTERPRET"


class EnvironmentProblem(ValueError):
    """The environment contradicts the run asked for; the message is one line."""


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def default_device() -> str:
    return "cuda" if cuda_available() else "cpu"


def prepare(device: str) -> None:
    """Make the environment right for a run on ``device`` (cpu: Triton's interpreter on; cuda:
    off), or say in one line why it cannot be."""
    kind = device.split(":")[0]
    if kind == "cuda" and not cuda_available():
        raise EnvironmentProblem("--device cuda but no CUDA device is available here (use --device cpu)")
    value = os.environ.get(INTERPRET)
    if kind == "cpu":
        if value not in (None, "", "1"):
            raise EnvironmentProblem(
                f"{INTERPRET}={value} on a CPU run: Triton kernels run on the CPU only under "
                f"its interpreter; unset {INTERPRET} (or set it to 1)"
            )
        if value != "1" and "triton" in sys.modules and _kernels_imported():
            raise EnvironmentProblem(f"{INTERPRET} was not set before Triton kernels were imported in this process")
        os.environ[INTERPRET] = "1"
    elif value == "1":
        raise EnvironmentProblem(
            f"{INTERPRET}=1 on a CUDA run would interpret the kernels on the CPU; unset it for --device cuda"
        )


def _kernels_imported() -> bool:
    return any(name.startswith(("mlafuzz.kernels.triton", "mlafuzz.harness.fast")) for name in sys.modules)
