"""The executor protocol the fuzz loop, shrinking and replay drive, and the in-process executor.

An executor takes tasks (``submit``), hands back their results (``wait``) and says how much
room it has; the fuzz loop knows nothing else of it. ``InProcess`` runs each task on submit
(fastest, no protection from a crash or a hang); ``pool.WorkerPool`` runs them in worker
processes that may die; the sanitizer's runs them under compute-sanitizer.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.tasks import Task, TaskResult, execute
from mlafuzz.harness.ops.op import OpTable

DEFAULT_TABLE = "mlafuzz.harness.ops.table:OPS"


class Executor(Protocol):
    def free_slots(self) -> int: ...
    def in_flight(self) -> int: ...
    def submit(self, task: Task) -> None: ...
    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]: ...
    def quarantine(self, classes: frozenset[tuple[str, str, str]]) -> None: ...
    def restarts(self) -> int: ...  # worker processes replaced so far (a crash, a hang, a broken context)
    def cancel(self) -> None: ...  # drop every task in flight, their results never come
    def close(self) -> None: ...


def drop_queued(executor: Executor) -> list[Task]:
    """Take back the tasks ``executor`` holds that have not started (their results never come);
    the ones running go on. An executor without a queue of its own has none to give back."""
    drop = getattr(executor, "drop_queued", None)
    return drop() if drop is not None else []


class WorkerStartError(RuntimeError):
    """Workers die before they are ready: an environment problem, reported as one line."""


def table_from_ref(ref: str) -> OpTable:
    """The op table a ``module:attr`` reference names (workers import it; default: OPS)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def strip_quarantined(task: Task, classes: frozenset[tuple[str, str, str]]) -> Task:
    """The task without its error input when that class is quarantined for its implementation."""
    if task.contract is not None and (task.op, task.impl_ref, task.contract) in classes:
        import dataclasses

        return dataclasses.replace(task, contract=None)
    return task


class InProcess:
    """Runs each task on submit, in this process: fastest, no protection from crashes."""

    def __init__(self, *, session: Session | None = None, redzone: bool = False) -> None:
        if session is None:
            rz = None
            if redzone:
                from mlafuzz.harness.memory import redzone as rzmod

                rz = rzmod.install()
            session = Session(table=table_from_ref(DEFAULT_TABLE), redzone=rz)
        self.session = session
        self._done: list[tuple[Task, TaskResult]] = []
        self._held: frozenset[tuple[str, str, str]] = frozenset()

    def free_slots(self) -> int:
        return 0 if self._done else 1

    def in_flight(self) -> int:
        return len(self._done)

    def submit(self, task: Task) -> None:
        self._done.append((task, execute(strip_quarantined(task, self._held), self.session)))

    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]:
        done, self._done = self._done, []
        return done

    def quarantine(self, classes: frozenset[tuple[str, str, str]]) -> None:
        self._held = classes

    def restarts(self) -> int:
        return 0  # nothing to restart: a crash here ends the run

    def cancel(self) -> None:
        self._done = []

    def close(self) -> None:
        pass
