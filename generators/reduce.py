"""Shrink steps shared by every op's reducer (generators/ops/<op>.py ``reduce``).

A reducer yields simpler specs than the one it is given, simplest first; the
harness's shrinker (harness/drive/shrink.py) keeps the first that still shows
the finding. These helpers say what "simpler" means for the parts every spec
has: a tuple of requests, an int, the paging.

``shrink_key`` makes "simpler" a well-founded order, so that shrinking ends: the
shrinker tries only proposals whose key is strictly smaller than the case in
hand's. It is generic over spec dataclasses (a new op's spec needs nothing; one
may define a ``shrink_key()`` method of its own, returning a tuple of
non-negative ints that its reducer's steps make strictly smaller).
"""

from __future__ import annotations

import dataclasses
import enum
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


_NO_DEFAULT = object()


def shrink_key(spec: Any) -> tuple[int, ...]:
    """A spec's place in the shrink order: (size, options off their simplest value), compared as a
    tuple of non-negative ints, so every strictly decreasing chain of keys is finite.

    Size: every int in the spec (nested dataclasses, requests and all), plus the length of every
    tuple (a request fewer is smaller). Options: every field that has a default and is not at it
    (the spec's default is its simplest value: PLAIN views, the contiguous layout, no padding...),
    every bool without a default that is True, every enum without a default by its position."""
    own = getattr(spec, "shrink_key", None)
    if callable(own):
        return tuple(own())
    size, off = _measure(spec, _NO_DEFAULT)
    return (size, off)


def _measure(value: Any, default: Any) -> tuple[int, int]:
    """(size, options off their simplest value) of one value whose field default is ``default``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        size = off = 0
        for f in dataclasses.fields(value):
            a, b = _measure(getattr(value, f.name), _field_default(f))
            size, off = size + a, off + b
        return size, off
    if isinstance(value, (tuple, list)):
        size, off = len(value), 0
        for item in value:
            a, b = _measure(item, _NO_DEFAULT)
            size, off = size + a, off + b
        return size, off
    size = abs(value) if _plain_int(value) else 0
    if default is _NO_DEFAULT:
        if isinstance(value, enum.Enum):
            return size, list(type(value)).index(value)
        return size, int(value) if isinstance(value, bool) else 0
    # An int is measured by its size alone; any other value (an enum, a flag, an optional int
    # that is given) counts one option when it is off its default.
    return size, int(value != default and not (_plain_int(value) and _plain_int(default)))


def _plain_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, (bool, enum.Enum))


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _NO_DEFAULT


def to_defaults(spec: Any, *names: str) -> Iterator[Any]:
    """``spec`` with each named field that is off its default (its simplest value) reset to it."""
    for f in dataclasses.fields(spec):
        if f.name in names:
            default = _field_default(f)
            if default is not _NO_DEFAULT and getattr(spec, f.name) != default:
                yield from attempt(lambda: dataclasses.replace(spec, **{f.name: default}))  # noqa: B023
