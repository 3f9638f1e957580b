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
    # Tensors derived from the case once and reused by its checks (the fused gather check's
    # row -> record map): the case's tensors never change, so neither do these. Not an init field,
    # so dataclasses.replace (which makes a case with other tensors) starts an empty one.
    memo: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

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
        """Fresh copies that keep each tensor's strides (non-contiguous inputs stay so), except
        the names in ``skip``."""
        skip = frozenset(skip)
        return {k: _clone_keep_strides(v) for k, v in self.tensors.items() if k not in skip}


def case_id_for(*, op: str, seed: int, spec_json: str) -> str:
    """A short stable id: op, seed and a digest of the spec."""
    digest = hashlib.sha256(spec_json.encode()).hexdigest()[:10]
    return f"{op}-{seed}-{digest}"


def _clone_keep_strides(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if t.is_contiguous():
        return t.clone()
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
