"""Executors: run tasks in-process, or in spawned worker processes that may die.

Workers are started with the ``spawn`` method (never fork after CUDA is
initialised), one per device slot. A worker that dies (illegal address, abort,
segfault) yields a CRASH finding for the task it held; one that exceeds the
task timeout is killed and yields TIMEOUT. Either way it is replaced and the run
goes on.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Protocol

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.tasks import Task, TaskResult, execute
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.reports.findings import Finding, Kind


class Executor(Protocol):
    def free_slots(self) -> int: ...
    def in_flight(self) -> int: ...
    def submit(self, task: Task) -> None: ...
    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]: ...
    def close(self) -> None: ...


class WorkerStartError(RuntimeError):
    """Workers die before they are ready: an environment problem, reported as one line."""


MAX_START_FAILURES = 3


def table_from_ref(ref: str) -> OpTable:
    """The op table a ``module:attr`` reference names (workers import it; default: OPS)."""
    import importlib

    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


DEFAULT_TABLE = "mlafuzz.harness.ops.table:OPS"


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

    def free_slots(self) -> int:
        return 0 if self._done else 1

    def in_flight(self) -> int:
        return len(self._done)

    def submit(self, task: Task) -> None:
        self._done.append((task, execute(task, self.session)))

    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]:
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        pass


def _worker_main(conn: Connection, device: str, redzone: bool, threads: int, table_ref: str) -> None:
    # TRITON_INTERPRET was decided by the parent's entry point and is inherited: nothing to set here.
    import torch

    # Share the cores: N workers each running torch's default one-thread-per-core CPU ops
    # (case generation, host-side oracle work) oversubscribe the machine N times over.
    torch.set_num_threads(threads)

    rz = None
    if device.startswith("cuda"):
        if redzone:  # must precede this process's first CUDA allocation
            from mlafuzz.harness.memory import redzone as rzmod

            rz = rzmod.install()
        torch.cuda.set_device(torch.device(device))
    session = Session(table=table_from_ref(table_ref), redzone=rz)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        result = execute(task, session)
        broken = _cuda_broken(device) if device.startswith("cuda") else None
        if broken is not None:
            result = charge_broken_context(task, result, broken, session.table)
        # "retire" rides on the result itself: the pool must never hand this worker another task.
        conn.send(("result", {**result.to_wire(), "retire": broken is not None}))
        if broken is not None:
            # An illegal address leaves the process's CUDA context unusable: every later case
            # would fail here. Exit; the pool replaces this worker with a fresh process.
            conn.close()
            os._exit(3)


def _cuda_broken(device: str) -> str | None:
    """None while this process's CUDA context still works, else the error it now raises.
    Synchronizing after every case also pins an asynchronous fault on the case that caused it."""
    import torch

    try:
        torch.cuda.synchronize(device)  # a sticky fault is returned by every later call, this one too
        return None
    except Exception as exc:  # torch.AcceleratorError / RuntimeError: the context is gone
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}"


def charge_broken_context(task: Task, result: TaskResult, error: str, table: OpTable) -> TaskResult:
    """The case after which the CUDA context broke caused it: a CRASH for it (its other findings
    kept, harness errors the broken context caused dropped)."""
    kept = tuple(f for f in result.findings if f.cause != "harness_error")
    described = task.with_spec(table)
    crash = Finding(kind=Kind.CRASH, op=task.op, impl=task.impl_ref, case_id=task.case_id(table), seed=task.seed,
                    spec=described.spec, cause="cuda_context",
                    message=f"the CUDA context broke during this case ({error}); worker replaced")
    return TaskResult(findings=kept + (crash,), skipped=result.skipped, seconds=result.seconds)


def _death_message(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker died"
    if exitcode < 0:
        try:
            return f"worker killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with status {exitcode}"


@dataclass
class _Worker:
    device: str
    process: mp.process.BaseProcess
    conn: Connection
    ready: bool = False
    task: Task | None = None
    started: float = 0.0


class WorkerPool:
    """One spawned worker per device slot; crash- and hang-proof."""

    def __init__(self, *, devices: list[str], timeout: float, redzone: bool = False,
                 table_ref: str = DEFAULT_TABLE) -> None:
        if not devices:
            raise ValueError("WorkerPool: devices=[] must name at least one device")
        self._table_ref = table_ref
        self._table = table_from_ref(table_ref)
        self._ctx = mp.get_context("spawn")
        self._timeout = timeout
        self._redzone = redzone
        self._start_failures = 0
        self._size = len(devices)
        self._workers = [self._start(d) for d in devices]

    def _start(self, device: str) -> _Worker:
        parent, child = self._ctx.Pipe()
        threads = max(1, (os.cpu_count() or 1) // max(1, self._size))
        proc = self._ctx.Process(target=_worker_main, args=(child, device, self._redzone, threads, self._table_ref),
                                 daemon=True,
                                 name=f"mlafuzz-{device}")
        proc.start()
        child.close()
        return _Worker(device=device, process=proc, conn=parent)

    def free_slots(self) -> int:
        return sum(1 for w in self._workers if w.ready and w.task is None)

    def in_flight(self) -> int:
        return sum(1 for w in self._workers if w.task is not None)

    def submit(self, task: Task) -> None:
        worker = next(w for w in self._workers if w.ready and w.task is None)
        task = _on_device(task, worker.device)
        worker.task, worker.started = task, time.monotonic()
        worker.conn.send(task)

    def _replace(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()
        self._workers[self._workers.index(worker)] = self._start(worker.device)

    def _lost(self, worker: _Worker, kind: Kind, message: str) -> tuple[Task, TaskResult]:
        task = worker.task
        assert task is not None
        described = task.with_spec(self._table)
        finding = Finding(kind=kind, op=task.op, impl=task.impl_ref, case_id=task.case_id(self._table),
                          seed=task.seed, spec=described.spec, cause=kind.value.lower(), message=message,
                          extra={"device": worker.device})
        self._replace(worker)
        return task, TaskResult(findings=(finding,), seconds=time.monotonic() - worker.started)

    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]:
        out: list[tuple[Task, TaskResult]] = []
        watch = {w.conn: w for w in self._workers}
        watch.update({w.process.sentinel: w for w in self._workers})
        ready = wait(list(watch), timeout=timeout)
        now = time.monotonic()
        seen: set[int] = set()
        for handle in ready:
            worker = watch[handle]
            if id(worker) in seen:
                continue
            seen.add(id(worker))
            got_message = retire = False
            try:
                while worker.conn.poll():
                    tag, payload = worker.conn.recv()
                    got_message = True
                    if tag == "ready":
                        worker.ready = True
                        self._start_failures = 0
                    elif tag == "result" and worker.task is not None:
                        out.append((worker.task, TaskResult.from_wire(payload)))
                        worker.task = None
                        retire = bool(payload.get("retire"))
            except (EOFError, OSError):
                pass
            if retire:  # its CUDA context broke: it is exiting; start its successor now
                self._replace(worker)
                continue
            if not worker.process.is_alive() and not got_message:
                if worker.task is not None:
                    worker.process.join(timeout=1)
                    out.append(self._lost(worker, Kind.CRASH, f"{_death_message(worker.process.exitcode)} "
                                                              f"while running this case on {worker.device}"))
                else:
                    if not worker.ready:
                        self._start_failures += 1
                        if self._start_failures >= MAX_START_FAILURES:
                            raise WorkerStartError(
                                f"worker processes on {worker.device} die before they are ready "
                                f"({_death_message(worker.process.exitcode)}, {self._start_failures} times); "
                                "their error is printed above; --in-process shows it directly")
                    self._replace(worker)  # died while idle or starting: bring up another
        for worker in list(self._workers):
            if worker.task is not None and now - worker.started > self._timeout:
                out.append(self._lost(worker, Kind.TIMEOUT,
                                      f"no result after {self._timeout:.0f} s on {worker.device}; worker killed"))
        return out

    def close(self) -> None:
        for w in self._workers:
            try:
                if w.task is None:
                    w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 3
        for w in self._workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=2)


def _on_device(task: Task, device: str) -> Task:
    import dataclasses

    return dataclasses.replace(task, device=device)


def device_slots(*, device: str, workers: int | None) -> list[str]:
    """Device strings for the workers: one per GPU by default, or ``workers`` CPU processes."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        n = workers or count
        return [f"cuda:{i % count}" for i in range(n)]
    return ["cpu"] * (workers or 1)
