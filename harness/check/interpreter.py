"""Environment limits: an implementation's call that failed because of the installed Triton's CPU
interpreter, not because of the implementation.

Triton's interpreter (``TRITON_INTERPRET=1``) runs a kernel's Python on numpy arrays; a newer
Triton can refuse a construct that an older one, and every compiled Triton, runs. Triton 3.7
began refusing a load or store mask that is not a bool array, and 3.9's interpreter makes one
of the commonest constructs non-bool: a tile's condition combined with a scalar condition loaded
from memory (vLLM's convert: ``mask=valid_block & ~is_prefill``). The compiled kernel is fine,
so on the CPU every such case would be a false EXCEPTION against the implementation.

``KNOWN_LIMITS`` is data: the text the interpreter's error carries, the first Triton version that
raises it, and what to say. A call whose exception (or an exception it was raised from) is one
of them, while the interpreter is on and its Triton is that new, makes the case a counted skip
with that reason (``EnvironmentLimit``), never a finding. Any other exception is the
implementation's EXCEPTION, as always.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class KnownLimit:
    text: str  # in the message of the exception the interpreter raised
    since: tuple[int, int]  # the first Triton (major, minor) whose interpreter raises it
    what: str  # what it cannot run, for the skip reason
    advice: str


KNOWN_LIMITS: tuple[KnownLimit, ...] = (
    KnownLimit(
        text="mask has unsupported dtype",
        since=(3, 7),
        what="this kernel's masked loads and stores (mask has unsupported dtype: a tile's condition"
        " combined with a scalar one loaded from memory)",
        advice="use Triton <= 3.6 on the CPU, or a GPU",
    ),
)


class EnvironmentLimit(Exception):
    """A call failed on a known limit of this environment (``reason`` says which, and what to do):
    the case is skipped and counted, not judged."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _triton_version() -> tuple[str, tuple[int, int]] | None:
    try:
        import triton
    except ImportError:
        return None
    text = str(getattr(triton, "__version__", ""))
    parts = text.split(".")
    try:
        return text, (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during (a wrapper's re-raise keeps them)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _from_interpreter(exc: BaseException) -> bool:
    """Whether the interpreter raised ``exc`` (its ``InterpreterError``, which wraps what failed
    inside it), not an implementation's own code whose message only reads the same."""
    return any(type(e).__name__ == "InterpreterError" and type(e).__module__.startswith("triton") for e in _chain(exc))


def interpreter_limit(exc: BaseException | None) -> str | None:
    """The skip reason when ``exc`` is a known limit of the installed Triton's CPU interpreter,
    else None (the implementation's own exception)."""
    if exc is None or os.environ.get("TRITON_INTERPRET") != "1" or not _from_interpreter(exc):
        return None
    version = _triton_version()
    if version is None:
        return None
    text, number = version
    messages = [str(e) for e in _chain(exc)]
    for limit in KNOWN_LIMITS:
        if number >= limit.since and any(limit.text in m for m in messages):
            return f"Triton {text}'s interpreter cannot run {limit.what}; {limit.advice}"
    return None
