"""What one process keeps between cases: the op table, the registry, the implementations it has
loaded (each once, and once per contract revision for an entry that follows revisions), the
sub-implementations a pipeline op calls, and warn-once notes.

One ``Session`` per worker process (or per in-process run), built at its start
and handed down: nothing here lives in module globals.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from mlafuzz.harness.check.pipeline import DETECTORS, Detector
from mlafuzz.harness.memory.redzone import RedZone
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.kernels.entry import ImplEntry, ImplError
from mlafuzz.kernels.registry import Registry, default_registry


def sub_env(op: str) -> str:
    """The variable naming a pipeline op's sub-implementation of ``op`` (``MLAFUZZ_STEP_CONVERT``):
    the environment, so spawned workers inherit the choice."""
    return f"MLAFUZZ_STEP_{op.upper()}"


def default_ref(table: OpTable, registry: Registry, op: str, device: str) -> str:
    """The op's default implementation here: the first of its table defaults this machine can
    load (our Triton convert needs triton; without it, the torch one)."""
    kind = device.split(":")[0]
    names = table.get(op).defaults.get(kind, ())
    for name in names:
        entry = registry.get(op, name)
        if entry is not None and not entry.missing() and kind in entry.devices:
            return name
    raise ImplError(
        f"no default implementation of op {op!r} can run on {kind} here"
        f" (tried: {', '.join(names) or 'none'}); pass --impl {op}=..."
    )


@dataclass
class SubImpls:
    """``sub(op)``: the callable a pipeline implementation gets for a sub-op; ``refs`` names them."""

    session: Session
    device: str
    refs: dict[str, str] = field(default_factory=dict)

    def __call__(self, op: str) -> Callable:
        ref = os.environ.get(sub_env(op)) or default_ref(self.session.table, self.session.registry, op, self.device)
        self.refs[op] = ref
        return self.session.load(self.session.entry(op, ref), self.device)


class Session:
    def __init__(
        self,
        *,
        table: OpTable,
        registry: Registry | None = None,
        redzone: RedZone | None = None,
        detectors: tuple[Detector, ...] = DETECTORS,
    ) -> None:
        self.table = table
        self.detectors = detectors  # the full path's steps, in order (check/pipeline.py)
        self.registry = registry if registry is not None else default_registry()
        self.redzone = redzone
        self.fast: Any = None  # the GPU fast path's resources (harness/fast), when this process uses it
        self._entries: dict[tuple[str, str, frozenset[str] | None, frozenset[str]], ImplEntry] = {}
        self._loaded: dict[tuple[str, str, str, str | None], Callable] = {}
        self._warned: set[str] = set()

    def entry(
        self, op: str, ref: str, *, rejects: Iterable[str] | None = None, features: Iterable[str] = ()
    ) -> ImplEntry:
        """The registry entry ``--impl op=ref`` names, resolved once per process; ``features``: the
        optional surfaces the user declared it takes (``--features``), added to its capabilities."""
        declared = frozenset(features)
        key = (op, ref, frozenset(rejects) if rejects is not None else None, declared)
        if key not in self._entries:
            row = self.table.get(op)
            entry = self.registry.resolve(
                op, ref, contract=row.contract, rejects=rejects, vllm=row.vllm, vllm_devices=row.vllm_devices
            )
            self._entries[key] = entry.with_declared(declared)
        return self._entries[key]

    def load(self, entry: ImplEntry, device: str, *, revision: str | None = None) -> Callable:
        """The entry's callable for ``device``, loaded once per process; for an entry that follows
        revisions (``ImplEntry.revisions``), the one bound to ``revision`` (None: the newest), one
        per revision. Other entries ignore ``revision``: one callable serves every case. An
        ImplError (one line) when its signature cannot take the call the op makes (its row's
        ``call``)."""
        if entry.revisions is None:
            revision = None
        elif revision is None:
            revision = NEWEST_REVISION
        key = (entry.op, entry.name, device.split(":")[0], revision)
        if key not in self._loaded:
            fn = entry.load(device, revision=revision)
            shape = self.table.get(entry.op).call
            why = shape.mismatch(fn) if shape is not None else None
            if why is not None:
                raise ImplError(
                    f"--impl {entry.op}={entry.name}: cannot take the call {shape.text(entry.op)} of docs/contract.md ({why})"
                )
            self._loaded[key] = fn
        return self._loaded[key]

    def sub(self, device: str) -> SubImpls:
        return SubImpls(session=self, device=device)

    def default_ref(self, op: str, device: str) -> str:
        return default_ref(self.table, self.registry, op, device)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
