"""An op's generator: everything that makes, describes and shrinks its cases, as one record.

Each op's module in generators/ops/ exposes one ``GENERATOR``; the op table's
row (harness/ops/op.py) holds it whole, so adding an op names its generator once
instead of copying its parts into the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import SpecDrawer
from mlafuzz.generators.invalid import InvalidClass


@dataclass(frozen=True, kw_only=True)
class Generator:
    spec_type: type  # the op's spec class (its ``op`` tag names the op)
    draw: SpecDrawer  # (drawer, knobs) -> a spec
    materialize: Callable[..., Case]  # (spec, *, seed, device) -> Case
    features: Callable[[Any], set[str]]  # case features for coverage, from the spec alone
    size: Callable[[Any], dict[str, int]]  # a few numbers saying how big a case is, for reports
    reduce: Callable[[Any], Iterator[Any]]  # simpler specs, simplest first (shrinking)
    invalid: tuple[InvalidClass, ...] = ()  # error-input classes
    # Classes out of the rotation (each would cost every class turns): drawn only in runs whose
    # --contract promises them, so a user may still name them (docs/contract.md lists both).
    promisable: tuple[InvalidClass, ...] = ()
