"""A registry entry: one implementation of one op, what it needs and what it promises."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import shutil
from dataclasses import dataclass
from typing import Callable, Iterable


class ImplError(ValueError):
    """An --impl reference that cannot be resolved or loaded; the message is one line for the user."""


@dataclass(frozen=True, kw_only=True)
class ImplEntry:
    op: str
    name: str
    loader: Callable[[str], Callable]  # device kind -> callable; imports lazily
    devices: frozenset[str]
    rejects: frozenset[str]  # error-input classes it promises to refuse
    description: str = ""
    capabilities: frozenset[str] = frozenset({"seq_starts"})  # optional SPEC features it has
    # Where ``capabilities`` came from, for the run's header: "registry" (the entry declares them),
    # "signature" (read from the callable's parameters, kernels/external.py), "opaque" (a signature
    # with ``**kwargs`` or none readable: it proves nothing, so only what ``declared`` adds).
    surfaces_from: str = "registry"
    declared: frozenset[str] = frozenset()  # surfaces the user declared (``--features``), in ``capabilities`` too
    requires: tuple[str, ...] = ()  # Python packages it cannot be loaded without (e.g. triton)
    tools: tuple[str, ...] = ()  # programs on PATH it builds itself with on first load (e.g. g++)
    expected_kind: str | None = None  # for planted-bug mutants: the finding kind it should draw
    is_mutant: bool = False
    awaits: str | None = None  # for mutants: the drawn inputs its bug needs that are not drawn yet
    size: str = "small"  # for mutants: the case sizes (fuzz --size) that draw the inputs its bug needs
    group: str | None = None  # for mutants: the family `mutants` sums one recall line for (e.g. "vllm-reports")
    # For mutants: knob values (generators.draw.Knobs) its cases are drawn with, e.g. the nvfp4 writer
    # revision a writer bug is judged under (it writes another revision's rule: fuzz --nvfp4-writer).
    draws: tuple[tuple[str, object], ...] = ()
    # Contract revisions (SPEC section 7). ``revision``: the one this entry is always judged under
    # (a pin, e.g. a mutant of one revision's rule), whatever the run names. ``revisions``: the
    # ones it can follow, by a keyword-only ``revision=`` argument the harness binds (our writers);
    # then it is judged under the run's. Neither (external implementations): it implements one
    # revision, the one the run names.
    revision: str | None = None
    revisions: frozenset[str] | None = None
    # What it compiles on its first call (an extension, a helper library), built ahead of time for
    # a device kind: a timed run (``mutants``) then charges no build to its first cases.
    prepare: Callable[[str], None] | None = None
    # Whether it calls our CUDA extension (kernels/cuda_ext.py) on a GPU: a cold run builds that in
    # the background first, and only this entry's cases wait for it.
    extension: bool = False

    def __post_init__(self) -> None:
        if self.revision is not None and self.revisions is not None:
            raise ValueError(
                f"ImplEntry {self.op}={self.name}: revision={self.revision!r} pins one revision,"
                f" revisions={sorted(self.revisions)} follows the run's: give one of them"
            )

    def with_declared(self, names: Iterable[str]) -> ImplEntry:
        """This entry given the surfaces ``names`` too, as the user declared them (``--features``)."""
        names = frozenset(names)
        if not names:
            return self
        return dataclasses.replace(self, capabilities=self.capabilities | names, declared=self.declared | names)

    def missing(self) -> tuple[str, ...]:
        """The packages of ``requires`` this Python cannot import, then the ``tools`` not on PATH."""
        return self._missing_packages() + self._missing_tools()

    def _missing_packages(self) -> tuple[str, ...]:
        return tuple(p for p in self.requires if not _importable(p))

    def _missing_tools(self) -> tuple[str, ...]:
        return tuple(t for t in self.tools if shutil.which(t) is None)

    def check_device(self, device: str) -> str:
        """The device kind ('cpu', 'cuda'); ImplError when this entry cannot run there."""
        kind = device.split(":")[0]
        if kind not in self.devices:
            raise ImplError(
                f"impl {self.op}={self.name} does not run on device={kind!r}"
                f" (runs on: {', '.join(sorted(self.devices))})"
            )
        missing = self._missing_packages()
        if missing:
            raise ImplError(
                f"impl {self.op}={self.name} needs {', '.join(missing)}, which is not installed here"
                f" (pip install 'mlafuzz[{missing[0]}]', or pick another --impl {self.op}=...)"
            )
        tools = self._missing_tools()
        if tools:
            raise ImplError(
                f"impl {self.op}={self.name} needs {', '.join(tools)} on PATH to build itself"
                f" (install it, or pick another --impl {self.op}=...)"
            )
        return kind

    def build(self, device: str) -> None:
        """Build now what this entry compiles on its first call on ``device`` (cached on disk, so
        every process that loads it later finds it); ImplError if it cannot run there."""
        if self.prepare is not None:
            self.prepare(self.check_device(device))

    def judged_under(self, run_revision: str) -> str:
        """The revision a case of this entry is judged under when the run names ``run_revision``."""
        return self.revision if self.revision is not None else run_revision

    def follows(self, revision: str) -> bool:
        """Whether this entry can be judged under ``revision``."""
        if self.revision is not None:
            return revision == self.revision
        return self.revisions is None or revision in self.revisions

    def load(self, device: str, *, revision: str | None = None) -> Callable:
        """A fresh load of the callable for ``device`` (callers keep it: harness sessions cache one
        per process, and per revision); ImplError if it cannot run there. For an entry that follows
        revisions, ``revision`` is bound as the call's keyword-only ``revision=``; otherwise it is
        ignored (a pinned entry's loader binds its own, an external one has none)."""
        fn = self.loader(self.check_device(device))
        if self.revisions is None or revision is None:
            return fn
        if revision not in self.revisions:
            raise ImplError(
                f"impl {self.op}={self.name} does not follow contract revision {revision!r}"
                f" (follows: {', '.join(sorted(self.revisions))})"
            )
        return functools.partial(fn, revision=revision)


def _importable(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken or blocked install is as good as none
        return False


def module_attr(module: str, attr: str) -> Callable[[str], Callable]:
    """A loader that imports ``module`` and takes ``attr`` when the entry is first loaded."""

    def load(device: str) -> Callable:
        return getattr(importlib.import_module(module), attr)

    return load
