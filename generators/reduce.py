"""Shrink steps shared by every op's reducer (generators/ops/<op>.py ``reduce``).

A reducer yields simpler specs than the one it is given, simplest first; the
harness's shrinker (harness/drive/shrink.py) keeps the first that still shows
the finding. These helpers say what "simpler" means for the parts every spec
has: a tuple of requests, an int, the paging.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

from mlafuzz.generators.spec import Layout, Paging


def paging_steps(p: Paging) -> Iterator[Paging]:
    if p.spare_blocks:
        yield dataclasses.replace(p, spare_blocks=0)
    if p.extra_table_cols:
        yield dataclasses.replace(p, extra_table_cols=0)
    if p.layout is not Layout.CONTIGUOUS:
        yield dataclasses.replace(p, layout=Layout.CONTIGUOUS)


def drop_each(items: tuple) -> Iterator[tuple]:
    """Each half, then every one-item-shorter tuple."""
    if len(items) > 1:
        half = len(items) // 2
        yield items[:half]
        yield items[half:]
        for j in range(len(items)):
            yield items[:j] + items[j + 1:]


def halvings(n: int, floor: int = 0) -> Iterator[int]:
    """floor, n // 2 and n - 1, those below n."""
    seen = set()
    for v in (floor, n // 2, n - 1):
        if floor <= v < n and v not in seen:
            seen.add(v)
            yield v


def with_request(spec: Any, j: int, **changes: Any) -> Any:
    """``spec`` with request ``j`` changed (raises SpecError if that is not a valid spec)."""
    reqs = spec.requests
    return dataclasses.replace(spec, requests=reqs[:j] + (dataclasses.replace(reqs[j], **changes),) + reqs[j + 1:])


def attempt(make: Callable[[], Any]) -> Iterator[Any]:
    """The spec ``make`` builds, or nothing when that reduction is not a valid spec."""
    try:
        yield make()
    except ValueError:  # SpecError
        return
