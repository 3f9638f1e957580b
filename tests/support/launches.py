"""Counting a case's device work on the CPU: the calls that would each be a kernel launch or a copy on a GPU.

With several worker processes on one GPU and no MPS, the GPU time-slices between their contexts,
so every launch and copy of a case costs a context's turn, not its own microseconds: a case's
count of device operations, not its kernel time, decides its cost (issue 27). Nothing launches on
the CPU, so the count is of what would, per kind and per site (the innermost mlafuzz frame):

- ``aten``: an aten op on a device tensor (or a factory that named a device), except the ones
  that launch nothing: views and metadata (an aliasing result that writes nothing: ``view``,
  ``slice``, ``as_strided``, ...), allocations (``empty*``) and ops on no elements;
- ``triton``: a Triton kernel launch (run by the CPU interpreter: its own torch work is not
  counted, on the GPU it is the one launch);
- ``transfer``: a copy between host and device without an aten op of its own (``tolist``,
  ``cpu``, ``numpy``, ``torch.tensor(data, device=...)``), as tests/support/syncs.py counts them.

Host tensors are told from device ones as syncs.py does (``on_host``): its counting runs too,
and its sync count is kept beside this one (``Work.syncs``).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from tests.support.syncs import SyncCount, counting, on_host, our_site

# Ops with an aliasing schema that still write nothing a kernel must (or with none, allocate only).
_NO_LAUNCH = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "set_"}
_TRANSFERS = ("tolist", "cpu", "numpy", "upload")


def _launches(func: Any) -> bool:
    """Whether ``func`` would launch a kernel (or copy) on a GPU: not a view, not an allocation."""
    if func._schema.name.split("::")[-1] in _NO_LAUNCH:
        return False
    returns = func._schema.returns
    # A view: every result aliases an input and none is written (an in-place op's is written).
    views = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
    return not views and func._schema.name != "aten::_unsafe_view"


class Work(TorchDispatchMode):
    """Counts, per kind and per site, the would-be device operations inside ``with counting_work() as w``."""

    def __init__(self, syncs: SyncCount) -> None:
        super().__init__()
        self.syncs = syncs
        self.kinds: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()  # "file:line what" of the innermost mlafuzz frame
        self.host_factories = 0  # inside a factory call that named no device: its ops are the host's

    def add(self, kind: str, what: str) -> None:
        self.kinds[kind] += 1
        site = our_site()
        if site is not None:
            self.sites[f"{site} {what}"] += 1

    @property
    def transfers(self) -> int:
        return sum(self.syncs.kinds[k] for k in _TRANSFERS)

    @property
    def total(self) -> int:
        """Launches and copies: aten ops, Triton launches and host<->device transfers."""
        return sum(self.kinds.values()) + self.transfers

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        out = func(*args, **kwargs)
        if self.syncs.paused or self.host_factories or not _launches(func):
            return out
        if leaves and all(map(on_host, leaves)):
            return out
        touched = leaves + [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if touched and not any(t.numel() for t in touched):
            return out  # no elements: no launch
        self.add("aten", func._schema.name.split("::")[-1])
        return out


class _HostFactories(TorchFunctionMode):
    """A factory call that names no device (``torch.zeros(n)``, ``torch.arange(n)``) makes a
    host tensor: its ops launch nothing."""

    def __init__(self, work: Work) -> None:
        super().__init__()
        self.work = work

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        host = kwargs.get("device") is None and not any(
            isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs))
        )
        self.work.host_factories += host
        try:
            return func(*args, **kwargs)
        finally:
            self.work.host_factories -= host


@contextlib.contextmanager
def counting_work() -> Iterator[Work]:
    """Count the would-be launches and copies of the block (and its syncs: ``Work.syncs``)."""
    with counting() as syncs:
        work = Work(syncs)
        try:
            from triton.runtime.interpreter import GridExecutor
        except ImportError:
            GridExecutor = None
        launch = GridExecutor.__call__ if GridExecutor is not None else None

        def launched(self: Any, *a: Any, **k: Any) -> Any:
            if not syncs.paused:
                work.add("triton", self.fn.__name__)
            return launch(self, *a, **k)  # syncs.py's own patch: pauses both counts inside

        if GridExecutor is not None:
            GridExecutor.__call__ = launched
        try:
            with work, _HostFactories(work):
                yield work
        finally:
            if GridExecutor is not None:
                GridExecutor.__call__ = launch
