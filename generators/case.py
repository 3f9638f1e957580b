"""The materialized case: tensors built from (spec, seed) on one device."""

from __future__ import annotations

import functools
import hashlib
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

from mlafuzz.generators.spec import spec_to_json


@dataclass(frozen=True, kw_only=True)
class Case:
    """Everything one call of an op needs, plus where it came from.

    ``tensors`` are the op's tensor arguments by their SPEC names; ``params`` its
    scalar arguments. Both are read-only views: the harness clones before each
    call, so a mutating implementation cannot poison the oracle's inputs.
    """

    op: str
    spec: Any
    seed: int
    device: str
    tensors: Mapping[str, torch.Tensor | None]
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", types.MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "params", types.MappingProxyType(dict(self.params)))

    @functools.cached_property
    def case_id(self) -> str:
        # Cached: encoding a realistic spec to JSON is thousands of Python calls, more host time
        # than the rest of a fast-path check (cached_property writes the instance dict directly,
        # so the frozen dataclass allows it; dataclasses.replace makes a new case, a new id).
        return case_id_for(op=self.op, seed=self.seed, spec_json=spec_to_json(self.spec))

    def cloned_tensors(self, *, skip: Iterable[str] = ()) -> dict[str, torch.Tensor | None]:
        """Fresh copies that keep each tensor's strides (non-contiguous inputs stay so) and the
        bytes between its elements, except the names in ``skip``."""
        skip = frozenset(skip)
        return {k: _clone_keep_strides(v) for k, v in self.tensors.items() if k not in skip}


def local_generator(seed: int) -> torch.Generator:
    """The case's own CPU generator: all of a case's randomness, never the global RNG."""
    return torch.Generator(device="cpu").manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def built(*, op: str, spec: Any, seed: int, device: str | torch.device,
          tensors: Mapping[str, torch.Tensor | None], params: Mapping[str, Any]) -> Case:
    """The case whose tensors were built (on the CPU) as ``tensors``, moved to ``device``."""
    dev = torch.device(device)
    moved = {k: (v.to(dev) if v is not None else None) for k, v in tensors.items()}
    return Case(op=op, spec=spec, seed=int(seed), device=str(dev), tensors=moved, params=params)


def case_id_for(*, op: str, seed: int, spec_json: str) -> str:
    """A short stable id: op, seed and a digest of the spec."""
    digest = hashlib.sha256(spec_json.encode()).hexdigest()[:10]
    return f"{op}-{seed}-{digest}"


def _clone_keep_strides(t: torch.Tensor | None) -> torch.Tensor | None:
    """A copy with t's strides and the bytes between its elements: a view's copy is a copy of the
    span of storage it covers (a column slice's other columns, the other half of a split row), so
    an implementation that reads between the elements, as a kernel assuming contiguity does,
    reads the case's values, never uninitialized memory."""
    if t is None:
        return None
    if t.is_contiguous():
        return t.clone()
    if t.numel() == 0:
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.as_strided((span,), (1,)).clone().as_strided(t.size(), t.stride())
