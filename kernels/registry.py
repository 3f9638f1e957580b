"""The registry of implementations under test, and resolution of ``--impl OP=REF``.

An entry names an op and an implementation, loads the callable lazily (so that
listing never imports Triton or builds CUDA), and states where it runs and its
contract: which invalid-input classes it promises to refuse with an exception.

REF is one of: a registered name (``triton``, ``torch``, ``cuda``, a mutant's
name), ``vllm`` (resolved from an installed vllm), ``package.module:attr`` or
``path/to/file.py:attr``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

OPS: tuple[str, ...] = ("convert", "gather", "writer", "step")

# What SPEC.md holds every external implementation to: section 3's "must
# reject" list for convert and section 4's host-side checks for gather.
SPEC_CONTRACTS: dict[str, frozenset[str]] = {
    "convert": frozenset({"length_mismatch", "wrong_dtype", "k_mismatch", "k_not_multiple_of_block_n"}),
    "gather": frozenset({"wrong_dtype", "wrong_shape", "device_mismatch"}),
    "writer": frozenset({"wrong_dtype", "wrong_shape"}),
    "step": frozenset(),
}


class ImplError(ValueError):
    """An --impl reference that cannot be resolved; the message is one line for the user."""


@dataclass(frozen=True, kw_only=True)
class ImplEntry:
    op: str
    name: str
    loader: Callable[[str], Callable]  # device -> callable; imports lazily
    devices: frozenset[str]
    rejects: frozenset[str]  # precondition classes it promises to refuse
    description: str = ""
    capabilities: frozenset[str] = frozenset({"seq_starts"})  # optional SPEC features it has
    expected_kind: str | None = None  # for planted-bug mutants: the finding kind it should draw
    is_mutant: bool = False
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def load(self, device: str) -> Callable:
        """The callable for ``device``; raises ImplError if it cannot run there."""
        kind = device.split(":")[0]
        if kind not in self.devices:
            raise ImplError(f"impl {self.op}={self.name} does not run on device={kind!r}"
                            f" (runs on: {', '.join(sorted(self.devices))})")
        if kind not in self._cache:
            self._cache[kind] = self.loader(kind)
        return self._cache[kind]


class Registry:
    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], ImplEntry] = {}

    def register(self, entry: ImplEntry) -> ImplEntry:
        if entry.op not in OPS:
            raise ValueError(f"ImplEntry: op={entry.op!r} must be one of {OPS}")
        key = (entry.op, entry.name)
        if key in self._entries:
            raise ValueError(f"ImplEntry: {entry.op}={entry.name} is registered twice")
        self._entries[key] = entry
        return entry

    def get(self, op: str, name: str) -> ImplEntry | None:
        return self._entries.get((op, name))

    def entries(self, *, op: str | None = None, mutants: bool | None = None) -> list[ImplEntry]:
        out = [e for e in self._entries.values() if op in (None, e.op)]
        if mutants is not None:
            out = [e for e in out if e.is_mutant == mutants]
        return sorted(out, key=lambda e: (e.op, e.is_mutant, e.name))


REGISTRY = Registry()


def _module_attr(module: str, attr: str) -> Callable[[str], Callable]:
    def load(device: str) -> Callable:
        if device == "cpu" and "triton" in module:
            # Triton reads TRITON_INTERPRET when a kernel is decorated: set it
            # before the kernel module is first imported.
            os.environ.setdefault("TRITON_INTERPRET", "1")
        return getattr(importlib.import_module(module), attr)
    return load


def register_builtin(*, op: str, name: str, module: str, attr: str, devices: Iterable[str],
                     rejects: Iterable[str], description: str, **extra) -> ImplEntry:
    return REGISTRY.register(ImplEntry(op=op, name=name, loader=_module_attr(module, attr),
                                       devices=frozenset(devices), rejects=frozenset(rejects),
                                       description=description, **extra))


# --- external implementations ---------------------------------------------

def _check_callable(obj: object, ref: str) -> Callable:
    if not callable(obj):
        raise ImplError(f"--impl {ref}: {type(obj).__name__} object is not callable")
    return obj  # type: ignore[return-value]


def _load_from_path(path_text: str, attr: str, ref: str) -> Callable:
    path = Path(path_text)
    if not path.is_file():
        raise ImplError(f"--impl {ref}: file {path_text!r} does not exist")
    mod_name = f"mlafuzz_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImplError(f"--impl {ref}: {path_text!r} is not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # spawned workers re-resolve by path, not by this name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed to import: say how, in one line
        raise ImplError(f"--impl {ref}: importing {path_text!r} failed: {type(exc).__name__}: {exc}") from None
    if not hasattr(module, attr):
        raise ImplError(f"--impl {ref}: {path_text!r} has no attribute {attr!r}")
    return _check_callable(getattr(module, attr), ref)


def _load_from_module(module_name: str, attr: str, ref: str) -> Callable:
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ImplError(f"--impl {ref}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplError(f"--impl {ref}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return _check_callable(obj, ref)


def external_entry(op: str, ref: str, *, rejects: Iterable[str] | None = None) -> ImplEntry:
    """An entry for ``module:attr`` or ``path.py:attr``, loaded now so errors surface early."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ImplError(f"--impl {op}={ref}: expected a registered name, 'vllm', 'module:attr' or 'path.py:attr'")
    is_path = target.endswith(".py") or "/" in target or os.sep in target
    fn = _load_from_path(target, attr, ref) if is_path else _load_from_module(target, attr, ref)
    fn, caps = adapt_signature(op, fn)
    return ImplEntry(op=op, name=ref, loader=lambda device: fn, devices=frozenset({"cpu", "cuda"}),
                     rejects=frozenset(SPEC_CONTRACTS[op] if rejects is None else rejects),
                     description=f"external implementation {ref}", capabilities=caps)


def adapt_signature(op: str, fn: Callable) -> tuple[Callable, frozenset[str]]:
    """Fit an external callable to SPEC's signature and say which optional features it has.

    A gather with ``seq_lens`` and no ``seq_starts`` (the pre-#48642 signature)
    is wrapped to the new call and lacks the ``seq_starts`` capability: cases
    that need it are skipped and reported, not failed.
    """
    if op != "gather":
        return fn, frozenset({"seq_starts"})
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and torch ops may hide their signature
        return fn, frozenset({"seq_starts"})
    if "seq_starts" not in params and "seq_lens" in params:
        from mlafuzz.kernels.vllm_loader import adapt_old_gather
        return adapt_old_gather(fn), frozenset()
    return fn, frozenset({"seq_starts"})


def resolve(op: str, ref: str, *, rejects: Iterable[str] | None = None) -> ImplEntry:
    """Resolve ``--impl op=ref``; every failure is an ImplError with one line."""
    _ensure_builtins()
    if op not in OPS:
        raise ImplError(f"--impl {op}={ref}: unknown op {op!r} (ops: {', '.join(OPS)})")
    entry = REGISTRY.get(op, ref)
    if entry is not None:
        return entry
    if ref == "vllm":
        from mlafuzz.kernels.vllm_loader import vllm_entry
        return vllm_entry(op)
    if ":" in ref:
        return external_entry(op, ref, rejects=rejects)
    names = ", ".join(e.name for e in REGISTRY.entries(op=op)) or "none"
    raise ImplError(f"--impl {op}={ref}: no implementation named {ref!r} for op {op!r}"
                    f" (registered: {names}; or use vllm, module:attr, path.py:attr)")


def parse_impl_arg(text: str) -> tuple[str, str]:
    """'OP=REF' -> (op, ref) with a one-line ImplError when malformed."""
    op, sep, ref = text.partition("=")
    if not sep or not op or not ref:
        raise ImplError(f"--impl {text!r}: expected OP=NAME, OP=module:attr or OP=path.py:attr")
    if op not in OPS:
        raise ImplError(f"--impl {text!r}: unknown op {op!r} (ops: {', '.join(OPS)})")
    return op, ref


def _ensure_builtins() -> None:
    # Importing the catalog modules registers their entries exactly once.
    import mlafuzz.kernels.builtins  # noqa: F401
