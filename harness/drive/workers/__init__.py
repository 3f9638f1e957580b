"""Executors: run tasks in-process, or in spawned worker processes that may die.

The room, along its seams: ``protocol`` (what the fuzz loop asks of an executor, and the
in-process one), ``bootstrap`` (the worker process: start, warm-up, serving loop), ``phases``
(the codes a worker publishes about the part of its task it is in), ``crash`` (what a death, a
hang or a broken CUDA context is charged to), ``pool`` (the crash- and hang-proof pool of
workers) and ``slots`` (how many workers a device gets). The names callers use are re-exported
here, so ``from mlafuzz.harness.drive.workers import WorkerPool`` reads as it always did.
"""

from mlafuzz.harness.drive.workers.crash import charge_broken_context
from mlafuzz.harness.drive.workers.pool import WorkerPool
from mlafuzz.harness.drive.workers.protocol import (
    DEFAULT_TABLE,
    Executor,
    InProcess,
    WorkerStartError,
    drop_queued,
    strip_quarantined,
    table_from_ref,
)
from mlafuzz.harness.drive.workers.slots import (
    WORKER_BYTES,
    WORKER_CAP,
    SlotPlan,
    device_slots,
    plan_slots,
    slot_plan,
)

__all__ = [
    "DEFAULT_TABLE",
    "WORKER_BYTES",
    "WORKER_CAP",
    "Executor",
    "InProcess",
    "SlotPlan",
    "WorkerPool",
    "WorkerStartError",
    "charge_broken_context",
    "device_slots",
    "drop_queued",
    "plan_slots",
    "slot_plan",
    "strip_quarantined",
    "table_from_ref",
]
