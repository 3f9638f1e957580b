"""Small shared input helper for the metadata oracles."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

IntSeq = Tensor | Sequence[int]


def ints(x: IntSeq, name: str) -> list[int]:
    """A 1-D tensor or sequence of integers as a list of Python ints; the
    name=value message names the argument when it holds anything else."""
    values = x.reshape(-1).tolist() if isinstance(x, Tensor) else list(x)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name}={values[:8]}: must hold integers")
    return values
