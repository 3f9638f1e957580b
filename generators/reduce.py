"""Shrink steps shared by every op's reducer (generators/ops/<op>.py ``reduce``).

A reducer yields simpler specs than the one it is given, simplest first; the
harness's shrinker (harness/drive/shrink.py) keeps the first that still shows
the finding. These helpers say what "simpler" means for the parts every spec
has: a tuple of requests, an int, the paging.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

from mlafuzz.generators.spec import Layout, Paging, View


def paging_steps(p: Paging) -> Iterator[Paging]:
    if p.base_block:  # first: a small cache is much cheaper to run than one at the top of 4 GB
        yield dataclasses.replace(p, base_block=0)
    if p.spare_blocks:
        yield dataclasses.replace(p, spare_blocks=0)
    if p.extra_table_cols:
        yield dataclasses.replace(p, extra_table_cols=0)
    if p.layout is not Layout.CONTIGUOUS:
        yield dataclasses.replace(p, layout=Layout.CONTIGUOUS)


def view_steps(spec: Any, *fields: str) -> Iterator[Any]:
    """``spec`` with each of its view fields that is not PLAIN made PLAIN, one at a time."""
    for name in fields:
        if getattr(spec, name) is not View.PLAIN:
            yield dataclasses.replace(spec, **{name: View.PLAIN})


def view_features(paging: Paging, **views: View) -> set[str]:
    """Coverage features of the call-site views (SPEC 8) and of a cache's place in a larger one."""
    out = {f"view:{name}-{v.value}" for name, v in views.items() if v is not View.PLAIN}
    if paging.base_block:
        out.add("cache:high")
    return out


def drop_each(items: tuple) -> Iterator[tuple]:
    """Each half, then every one-item-shorter tuple."""
    if len(items) > 1:
        half = len(items) // 2
        yield items[:half]
        yield items[half:]
        for j in range(len(items)):
            yield items[:j] + items[j + 1 :]


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
    return dataclasses.replace(spec, requests=reqs[:j] + (dataclasses.replace(reqs[j], **changes),) + reqs[j + 1 :])


def attempt(make: Callable[[], Any]) -> Iterator[Any]:
    """The spec ``make`` builds, or nothing when that reduction is not a valid spec."""
    try:
        yield make()
    except ValueError:  # SpecError
        return
