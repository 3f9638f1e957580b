"""Error-input classes: one transform per precondition an op's call must satisfy.

Each class turns a valid case into one that violates exactly that precondition
(each op's classes live in its own generators/ops/<op>.py). ``memory_safe``
says whether an implementation that does *not* refuse it can run it without
touching memory outside its buffers; the harness runs unsafe classes only
against implementations that promise to refuse them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from mlafuzz.generators.case import Case


@dataclass(frozen=True, kw_only=True)
class InvalidClass:
    name: str
    description: str
    memory_safe: bool
    make: Callable[[Case], Case | None]  # None: the class does not apply to this case


def with_(case: Case, *, tensors: dict | None = None, params: dict | None = None) -> Case:
    """``case`` with some tensors or params replaced (the rest shared, never copied)."""
    return dataclasses.replace(
        case, tensors={**case.tensors, **(tensors or {})}, params={**case.params, **(params or {})}
    )
