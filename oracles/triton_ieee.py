"""IEEE f32 arithmetic for the fused Triton checks (oracles/fast_*.py), spelled so nothing bends it.

On the GPU each operation is one PTX instruction with explicit round-to-nearest-even and no
``.ftz`` (Triton's own ``/`` is an approximate division, and flags could flush subnormals);
under the CPU interpreter it is numpy's f32 arithmetic, which is IEEE and keeps subnormals.
"""

from __future__ import annotations

import contextlib
import os
from typing import ContextManager

import numpy as np
import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def use_asm(device: torch.device) -> bool:
    """The USE_ASM constexpr of a launch on ``device``: PTX on a compiled GPU kernel only."""
    return device.type == "cuda" and not INTERPRETED


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
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return a * b


@triton.jit
def div_rn(a, b, USE_ASM: tl.constexpr):
    """IEEE f32 a / b, round to nearest even, subnormals kept."""
    if USE_ASM:
        return tl.inline_asm_elementwise("div.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return a / b
