"""The optional fused generation room: a case's big tensors in one Triton launch each.

The torch builders of generators/rng are the definition of every byte a case holds; this room
makes the same bytes faster on a GPU, where the torch version is a dozen launches and several
passes over each big tensor (and, for a keyed permutation, a host sync per walking step). It
holds the kernels of the block table, the top-k rows, a convert batch's table and rows with each
row's request (one launch), the cache records and the writer's inputs and slots (``kernels.py``),
each taking the word table, pools
and permutation keys as arguments: it imports nothing of mlafuzz, so deleting the room, or switching
it off, loses only speed.

``MLAFUZZ_FUSED_GEN``: unset, on for CUDA tensors (Triton compiled); ``0``, off everywhere; ``1``,
on wherever Triton can run it, the CPU too when Triton runs interpreted (``TRITON_INTERPRET=1``,
set before triton is first imported): what the tests use to hold the kernels to the torch
builders byte for byte on a machine without a GPU.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

SWITCH = "MLAFUZZ_FUSED_GEN"

__all__ = ["SWITCH", "room"]


def room(device: torch.device | str) -> ModuleType | None:
    """The fused kernels for tensors on ``device``, or None: the torch builders make them."""
    mode = os.environ.get(SWITCH, "")
    kind = torch.device(device).type
    if mode == "0" or (kind == "cpu" and mode != "1"):
        return None  # decided before importing triton: a CPU run pays nothing for this room
    try:
        from mlafuzz.generators.fused import kernels
    except ImportError:  # no triton: the torch builders
        return None
    if kind == "cuda" and not kernels.INTERPRETED:
        return kernels
    if mode == "1" and kind == "cpu" and kernels.INTERPRETED:
        return kernels
    return None
