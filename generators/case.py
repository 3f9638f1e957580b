"""The materialized case: tensors built from (spec, seed) on one device."""

from __future__ import annotations

import functools
import hashlib
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

from mlafuzz.generators.rng.records import zeros
from mlafuzz.generators.spec import spec_to_json


@dataclass(frozen=True, kw_only=True)
class Case:
    """Everything one call of an op needs, plus where it came from.

    ``tensors`` are the op's tensor arguments by their SPEC names, as the call
    gets them (views, SPEC 8: a tensor's base lives as long as it does);
    ``params`` its scalar arguments. Both are read-only mappings: the harness
    clones before each call, so a mutating implementation cannot poison the
    oracle's inputs.

    ``zero_blocks``: for a cache at the top of a larger one (paging.base_block),
    its name -> n: its first n blocks (dim-0 rows) are all zero by
    construction, and no valid call reads or writes them. Copies make only the
    rest (``cloned_tensors``); the full path compares only the rest of an
    in-place output and checks that the zero blocks stayed zero.
    """

    op: str
    spec: Any
    seed: int
    device: str
    tensors: Mapping[str, torch.Tensor | None]
    params: Mapping[str, Any] = field(default_factory=dict)
    zero_blocks: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", types.MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "params", types.MappingProxyType(dict(self.params)))
        object.__setattr__(self, "zero_blocks", types.MappingProxyType(dict(self.zero_blocks)))

    @functools.cached_property
    def case_id(self) -> str:
        # Cached: encoding a realistic spec to JSON is thousands of Python calls, more host time
        # than the rest of a fast-path check (cached_property writes the instance dict directly,
        # so the frozen dataclass allows it; dataclasses.replace makes a new case, a new id).
        return case_id_for(op=self.op, seed=self.seed, spec_json=spec_to_json(self.spec))

    def cloned_tensors(self, *, skip: Iterable[str] = ()) -> dict[str, torch.Tensor | None]:
        """Fresh copies in the tensors' own layouts (a view's base is copied and the view made
        again: strides, storage offset and the bytes around and between its elements are kept),
        except the names in ``skip``. A tensor with zero blocks is copied as zeros (rng.records
        ``zeros``) and its other blocks."""
        skip = frozenset(skip)
        return {
            k: clone_like(v, zero_blocks=self.zero_blocks.get(k, 0)) for k, v in self.tensors.items() if k not in skip
        }

    def generated_tensors(self) -> dict[str, torch.Tensor]:
        """What a repro bundle stores and checks: every tensor, one with zero blocks only past them
        (a 4 GB cache holds a few MB the case made)."""
        return {
            k: (v[self.zero_blocks[k] :].clone() if self.zero_blocks.get(k) else v)  # its own storage
            for k, v in self.tensors.items()
            if v is not None
        }


def paged_case(
    spec: Any, *, seed: int, device: str, tensors: Mapping[str, Any], params: Mapping[str, Any], cache: str
) -> Case:
    """The case of ``spec``'s op (its ``op`` tag) whose tensor ``cache`` is a paged cache above
    ``spec.paging.base_block`` zero blocks (its ``zero_blocks``; none when there are none)."""
    base, dev = spec.paging.base_block, str(torch.device(device))
    zero = {cache: base} if base else {}
    return Case(op=spec.op, spec=spec, seed=int(seed), device=dev, tensors=tensors, params=params, zero_blocks=zero)


def case_id_for(*, op: str, seed: int, spec_json: str) -> str:
    """A short stable id: op, seed and a digest of the spec."""
    digest = hashlib.sha256(spec_json.encode()).hexdigest()[:10]
    return f"{op}-{seed}-{digest}"


_SMALL_BASE = 1 << 20  # a view's base up to this many bytes past the view is copied whole


def clone_like(t: torch.Tensor | None, *, zero_blocks: int = 0) -> torch.Tensor | None:
    """A copy of ``t`` in its own layout (``Case.cloned_tensors``): an implementation that reads
    outside a view's elements, as a kernel assuming contiguity does, reads the case's values in the
    copy too, never uninitialized memory. A pinned host tensor (the gather's host cache, SPEC 9.3)
    gets a pinned copy: a kernel may read it from the device."""
    if t is None:
        return None
    if t.device.type == "cpu" and t.is_pinned():
        return _clone_unpinned(t, zero_blocks).pin_memory()  # pin_memory() of a pinned t is t itself
    return _clone_unpinned(t, zero_blocks)


def _clone_unpinned(t: torch.Tensor, zero_blocks: int) -> torch.Tensor:
    if zero_blocks:
        out = zeros(tuple(t.shape), dtype=t.dtype, device=t.device)
        out[zero_blocks:] = t[zero_blocks:]
        return out
    storage = t.untyped_storage()
    span = t.numel() * t.element_size()
    if t.is_contiguous() and t.storage_offset() == 0 and storage.nbytes() == span:
        return t.clone()
    if storage.nbytes() <= 4 * span + _SMALL_BASE:  # a view of a base of about its size: copy the base
        base = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage).clone().view(t.dtype)
        return base.as_strided(t.size(), t.stride(), t.storage_offset())
    if t.is_contiguous():
        return t.clone()
    if t.numel() == 0:
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    # A small view of a large storage: the span it covers (the bytes between its elements).
    covered = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.as_strided((covered,), (1,)).clone().as_strided(t.size(), t.stride())
