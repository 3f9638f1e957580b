"""The registry of implementations under test, and resolution of ``--impl OP=REF``.

The registry is a plain, immutable collection of entries (kernels/entry.py),
built once from three lists: our kernels and the torch implementations
(builtins.py), the planted-bug catalog (mutants/catalog.py) and the step
pipeline with its planted bugs (step_pipeline.py). Nothing registers itself on
import. Loading an entry imports its module lazily, so listing never imports
Triton or builds CUDA.

REF is one of: a registered name (``triton``, ``torch``, ``cuda``, a mutant's
name), ``vllm`` (resolved from an installed vllm), ``package.module:attr`` or
``path/to/file.py:attr``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable

from mlafuzz.kernels.entry import ImplEntry, ImplError


@dataclass(frozen=True)
class Registry:
    entries_by_key: dict[tuple[str, str], ImplEntry]

    @classmethod
    def of(cls, entries: Iterable[ImplEntry]) -> Registry:
        table: dict[tuple[str, str], ImplEntry] = {}
        for e in entries:
            if (e.op, e.name) in table:
                raise ValueError(f"ImplEntry: {e.op}={e.name} is listed twice")
            table[(e.op, e.name)] = e
        return cls(table)

    def get(self, op: str, name: str) -> ImplEntry | None:
        return self.entries_by_key.get((op, name))

    def is_builtin(self, op: str, ref: str) -> bool:
        """Whether ``ref`` names a registered implementation or vLLM's installed one, rather than
        code it would import from a module or file (``module:attr``, ``path.py:attr``)."""
        return self.get(op, ref) is not None or ref == "vllm"

    def entries(self, *, op: str | None = None, mutants: bool | None = None) -> list[ImplEntry]:
        out = [e for e in self.entries_by_key.values() if op in (None, e.op)]
        if mutants is not None:
            out = [e for e in out if e.is_mutant == mutants]
        return sorted(out, key=lambda e: (e.op, e.is_mutant, e.name))

    def resolve(
        self,
        op: str,
        ref: str,
        *,
        contract: Iterable[str],
        rejects: Iterable[str] | None = None,
        vllm: tuple[tuple[str, str], ...] = (),
        vllm_devices: frozenset[str] = frozenset({"cuda"}),
    ) -> ImplEntry:
        """The entry ``--impl op=ref`` names; ``contract``: what SPEC holds an external
        implementation to (the op table's), unless ``rejects`` (a user's --contract) says less;
        ``vllm``: where an installed vllm keeps the op (the op table's row). Every failure is an
        ImplError with one line."""
        entry = self.get(op, ref)
        if entry is not None:
            return entry
        promised = frozenset(contract if rejects is None else rejects)
        if ref == "vllm":
            from mlafuzz.kernels.vllm import vllm_entry

            return vllm_entry(op, rejects=promised, candidates=vllm, devices=vllm_devices)
        if ":" in ref:
            from mlafuzz.kernels.external import external_entry

            return external_entry(op, ref, rejects=promised)
        names = ", ".join(e.name for e in self.entries(op=op)) or "none"
        raise ImplError(
            f"--impl {op}={ref}: no implementation named {ref!r} for op {op!r}"
            f" (registered: {names}; or use vllm, module:attr, path.py:attr)"
        )


@functools.cache
def default_registry() -> Registry:
    """Every built-in entry (built once per process: it is immutable)."""
    from mlafuzz.kernels.builtins import BUILTINS
    from mlafuzz.kernels.mutants.catalog import MUTANTS
    from mlafuzz.kernels.planner import PLAN_ENTRIES
    from mlafuzz.kernels.step_pipeline import STEP_ENTRIES

    return Registry.of((*BUILTINS, *MUTANTS, *STEP_ENTRIES, *PLAN_ENTRIES))


def parse_impl_arg(text: str, *, ops: Iterable[str]) -> tuple[str, str]:
    """'OP=REF' -> (op, ref) with a one-line ImplError when malformed."""
    known = tuple(ops)
    op, sep, ref = text.partition("=")
    if not sep or not op or not ref:
        raise ImplError(f"--impl {text!r}: expected OP=NAME, OP=module:attr or OP=path.py:attr")
    if op not in known:
        raise ImplError(f"--impl {text!r}: unknown op {op!r} (ops: {', '.join(known)})")
    return op, ref
