"""Small shared input helpers for the oracles (and the harness's checks, through harness.memory.bits)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

IntSeq = Tensor | Sequence[int]


def ints(x: IntSeq, name: str) -> list[int]:
    """A 1-D tensor or sequence of integers as a list of Python ints; the
    name=value message names the argument when it holds anything else."""
    values = x.reshape(-1).tolist() if isinstance(x, Tensor) else list(x)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name}={values[:8]}: must hold integers")
    return values


def host_copies(*values: Any) -> tuple[Any, ...]:
    """Each value with its tensors copied to the host, all those of one device in one host sync
    together (their bytes as one buffer): a sync per tensor stops a run with several workers on
    a GPU scaling (issue 29). A non-tensor is left for its reader to reject. Host tensors take the
    same path (a copy of a few small tensors), so a CPU run makes the calls a GPU run makes (tests
    count them: tests/support/syncs.py)."""
    out = list(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(i)
    for idx in by_device.values():
        if len(idx) == 1:
            out[idx[0]] = values[idx[0]].cpu()
            continue
        # Widest elements first: every part then starts at a multiple of its own element size, so
        # each is a view of the one host buffer in its dtype, with no copy of its own.
        idx = sorted(idx, key=lambda i: -values[i].element_size())
        parts = [values[i].contiguous().reshape(-1).view(torch.uint8) for i in idx]
        flat = torch.cat(parts).cpu()
        for i, part in zip(idx, flat.split([p.numel() for p in parts])):
            out[i] = part.view(values[i].dtype).reshape(values[i].shape)
    return tuple(out)
