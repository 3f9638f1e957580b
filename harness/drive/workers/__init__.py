"""Executors: run tasks in-process, or in worker processes that may die.

The room, along its seams: ``protocol`` (what the fuzz loop asks of an executor, and the
in-process one), ``context`` (how a worker process starts: forked from a server that imported
torch once, or spawned), ``bootstrap`` (the worker process: start, warm-up, serving loop),
``phases`` (the codes a worker publishes about the part of its task it is in), ``crash`` (what a
death, a hang or a broken CUDA context is charged to), ``pool`` (the crash- and hang-proof pool of
workers) and ``slots`` (how many workers a device gets). The names callers use are re-exported
here, so ``from mlafuzz.harness.drive.workers import WorkerPool`` reads as it always did.

The re-exports load on first use (PEP 562): a worker unpickles ``context.entry`` first, and
importing this package must not import Triton before that function has set the worker's
environment (``context``).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "charge_broken_context": "crash",
    "WorkerPool": "pool",
    "DEFAULT_TABLE": "protocol",
    "Executor": "protocol",
    "InProcess": "protocol",
    "WorkerStartError": "protocol",
    "drop_queued": "protocol",
    "strip_quarantined": "protocol",
    "table_from_ref": "protocol",
    "DEFAULT_BUDGET": "slots",
    "HUGE_BUDGET": "slots",
    "WorkerBudget": "slots",
    "budget_for": "slots",
    "SlotPlan": "slots",
    "device_slots": "slots",
    "plan_slots": "slots",
    "slot_plan": "slots",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value  # found once; later reads skip this function
    return value
