"""IEEE f32 arithmetic for the fused Triton checks (harness/fast/*.py), spelled so nothing bends it.

On the GPU each operation is one PTX instruction with explicit round-to-nearest-even and no
``.ftz`` (Triton's own ``/`` is an approximate division, and flags could flush subnormals);
under the CPU interpreter it is numpy's f32 arithmetic, which is IEEE and keeps subnormals.
"""

from __future__ import annotations

import contextlib
import functools
from typing import ContextManager

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def _probe():
    pass


# Whether this process's kernels were decorated under Triton's CPU interpreter: read off a kernel,
# which is what Triton itself decided when the module was imported.
INTERPRETED = type(_probe).__name__ == "InterpretedFunction"


def use_asm(device: torch.device) -> bool:
    """The USE_ASM constexpr of a launch on ``device``: PTX on a compiled GPU kernel only."""
    return device.type == "cuda" and not INTERPRETED


def use_cvt(device: torch.device) -> bool:
    """The USE_CVT constexpr: the PTX e4m3x2 conversions exist from sm_89 on."""
    return use_asm(device) and _capability(device.index if device.index is not None else -1) >= (8, 9)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index if index >= 0 else None)


def quiet() -> ContextManager:
    """Under the interpreter, numpy's overflow / inf / NaN warnings of the IEEE results the checks
    mean to produce are noise; elsewhere nothing to silence."""
    if INTERPRETED:
        return np.errstate(invalid="ignore", divide="ignore", over="ignore")
    return contextlib.nullcontext()


@triton.jit
def mul_rn(a, b, USE_ASM: tl.constexpr):
    """IEEE f32 a * b, round to nearest even, subnormals kept."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return a * b


@triton.jit
def div_rn(a, b, USE_ASM: tl.constexpr):
    """IEEE f32 a / b, round to nearest even, subnormals kept."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            "div.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return a / b
