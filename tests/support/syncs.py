"""Counting host<->device syncs on the CPU: the calls that would make the host wait for a GPU.

With several worker processes on one GPU, every sync waits while the other processes' contexts
take their turns, so a case's sync count, not its kernel time, decides whether a run scales with
workers (issue 29). Nothing syncs on the CPU, so the count is of the calls that would: the aten ops
that read a device value back (``item``/``int``/``bool`` -> ``_local_scalar_dense``,
``torch.equal``, ``nonzero``, a bool-mask index, ...) seen by a dispatch mode, and the Python
methods that copy to the host without an aten op of their own (``tolist``, ``cpu``, ``numpy``),
and ``torch.tensor(data, device=...)``: a blocking host-to-device copy waits for the stream too.
Not seen: ``x.to(device)`` of a host tensor (also a sync on a GPU; on the CPU it cannot be told
from a move within the host).
Calls inside a kernel run by Triton's CPU interpreter are not counted: on the GPU that is one
launch.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

# torch's text for one sync seen in ``torch.cuda.set_sync_debug_mode("warn")``. Not a looser match:
# setting the mode itself warns that it is "a prototype feature and does not yet detect all
# synchronizing operations", which is no sync.
CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"


def cuda_syncs(seen: list[Any]) -> int:
    """The syncs among warnings caught under CUDA's sync debug mode (``warnings.catch_warnings(record=True)``)."""
    return sum(CUDA_SYNC_WARNING in str(w.message) for w in seen)


aten = torch.ops.aten
# Ops whose result (a value or a size) is read on the host: each is one sync on a GPU.
_SYNC_OPS = {
    aten._local_scalar_dense.default: "item",
    aten.equal.default: "equal",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.repeat_interleave.Tensor: "repeat_interleave",
}
_ROOT = str(Path(__file__).resolve().parents[2]) + "/"  # the checkout: mlafuzz's own frames
_TESTS = _ROOT + "tests/"


def _ours(filename: str) -> bool:
    return filename.startswith(_ROOT) and not filename.startswith(_TESTS) and "site-packages" not in filename


def our_site() -> str | None:
    """ "file:line" of the innermost mlafuzz frame above the caller of the caller (a counter's
    ``add``), None when none is ours."""
    frame = sys._getframe(2)
    while frame is not None and not _ours(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else f"{frame.f_code.co_filename[len(_ROOT) :]}:{frame.f_lineno}"


_FROM_DATA = (torch.tensor, torch.as_tensor)
_HOST_METHODS = ("tolist", "cpu", "numpy")


def _bool_index(args: tuple[Any, ...]) -> bool:
    """An index op with a bool mask: its output size is the mask's count, read on the host."""
    idx = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx or ())


class SyncCount(TorchDispatchMode):
    """Counts, per kind, the would-be syncs of what runs inside ``with counting() as c``."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()  # "file:line kind" of the innermost mlafuzz frame
        self.paused = 0

    def add(self, kind: str) -> None:
        self.kinds[kind] += 1
        site = our_site()
        if site is not None:
            self.sites[f"{site} {kind}"] += 1

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        # A result is on the host when every tensor it is made from is; one made from none (a
        # factory: torch.zeros(n), torch.tensor(list)) is tagged by ``_Factories``, which sees
        # whether the caller named a device (here torch has filled in the default already).
        host = bool(inputs) and all(map(on_host, inputs))
        if not self.paused and not host:
            kind = _SYNC_OPS.get(func)
            if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is not None:
                kind = None  # its size is given: nothing is read back
            elif kind is None and func in (aten.index.Tensor, aten.index_put_.default) and _bool_index(args):
                kind = "bool_index"
            if kind is not None:
                self.add(kind)
        out = func(*args, **kwargs)
        if host:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    t._mlafuzz_host = True
        return out


class _Factories(TorchFunctionMode):
    """Tags what a factory made: on the host unless the call named a device."""

    def __init__(self, count: SyncCount) -> None:
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in _FROM_DATA and kwargs.get("device") is not None and not self.count.paused:
            self.count.add("upload")  # torch.tensor(data, device=...): a host-to-device copy
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and not any(
            isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs))
        ):
            out._mlafuzz_host = kwargs.get("device") is None
        return out


def on_host(t: torch.Tensor) -> bool:
    """Whether ``t`` would be a host tensor in a GPU run: made by ``.cpu()``, or from host tensors
    only. Everything else (the case's tensors, what is made from them or with a named device)
    would be on the device. A CPU run cannot tell ``x.to("cpu")`` from ``x.to(case.device)``: the
    project moves to the host with ``.cpu()`` only, so ``.to(...)`` counts as a move to the device."""
    return getattr(t, "_mlafuzz_host", False)


def _tagged(t: torch.Tensor, source: torch.Tensor, *, host: bool) -> torch.Tensor:
    """``t`` tagged as on the host or the device; a new alias where it is ``source`` itself (on
    the CPU, ``.cpu()`` and ``.to(same)`` return their input, whose own tag must stay)."""
    if t is source:
        t = t.view(t.shape)
    t._mlafuzz_host = host
    return t


@contextlib.contextmanager
def counting() -> Iterator[SyncCount]:
    """Count the would-be syncs of the block (the Triton interpreter's own work left out)."""
    count = SyncCount()
    originals = {name: getattr(torch.Tensor, name) for name in _HOST_METHODS}

    def host(name: str):  # noqa: ANN202
        orig = originals[name]

        def wrapped(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            if not count.paused and not on_host(self):
                count.add(name)
            count.paused += 1  # its own aten ops are the same sync
            try:
                out = orig(self, *a, **k)
            finally:
                count.paused -= 1
            return _tagged(out, self, host=True) if name == "cpu" else out

        return wrapped

    to = torch.Tensor.to

    def moved(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        named = "device" in k or any(isinstance(x, (str, torch.device)) for x in a)
        out = to(self, *a, **k)
        return _tagged(out, self, host=False) if named else out

    patches = [(torch.Tensor, name, host(name)) for name in _HOST_METHODS] + [(torch.Tensor, "to", moved)]
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:
        GridExecutor = None
    if GridExecutor is not None:
        launch = GridExecutor.__call__

        def interpreted(self: Any, *a: Any, **k: Any) -> Any:
            count.paused += 1
            try:
                return launch(self, *a, **k)
            finally:
                count.paused -= 1

        patches.append((GridExecutor, "__call__", interpreted))
    # tolist & co. live on torch's C base class: the patch shadows them and deleting it restores them.
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patches]
    try:
        for owner, name, fn in patches:
            setattr(owner, name, fn)
        with count, _Factories(count):
            yield count
    finally:
        for owner, name, fn in saved:
            if fn is None:
                delattr(owner, name)
            else:
                setattr(owner, name, fn)
