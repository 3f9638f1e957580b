"""The worker pool: one worker process per device slot (forked from a server that imported torch,
or spawned: ``context``), each with a short queue; crash- and hang-proof.

A worker that dies yields a CRASH finding for the task and part it held, one that exceeds the
task timeout is killed and yields TIMEOUT (``crash``), and the tasks queued behind it go to the
other workers. Either way it is replaced and the run goes on.

A case's time limit runs from the moment its worker starts it, after the worker's one-time
costs: its warm-up (imports, the word pool) before it is ready, and the loading of each
implementation before its first case with it (timed apart, under LOAD_SECONDS). A short
--timeout is not spent on them.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import select
import selectors
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.drive.workers.context import context, entry, environment
from mlafuzz.harness.drive.workers.crash import death_message, lost_finding
from mlafuzz.harness.drive.workers.phases import IDLE, LOAD_SECONDS, LOADING
from mlafuzz.harness.drive.workers.protocol import DEFAULT_TABLE, WorkerStartError, table_from_ref
from mlafuzz.reports.findings import Kind

QUEUE_DEPTH = 3  # tasks a worker holds: it starts the next case as soon as one is done
MAX_START_FAILURES = 3
WORKER_MAIN = "mlafuzz.harness.drive.workers.bootstrap:worker_main"  # named: imported after the env is set
START_LOG_LINES = 3  # lines of a dead worker's start-up stderr its WorkerStartError quotes


@dataclass
class _Worker:
    device: str
    process: mp.process.BaseProcess
    conn: Connection
    state: Any  # shared doubles: [task index, part (IDLE/VALID/CONTRACT), monotonic start]
    log: str  # where it writes its stderr while it starts (see _start_log)
    ready: bool = False
    failed: str | None = None  # the start-up error it sent, one line
    queue: collections.deque[Task] = field(default_factory=collections.deque)  # sent, no result yet

    def start_error(self) -> str:
        """Why it died before it was ready: the error it sent, else the last lines of its
        start-up stderr, else its exit status alone."""
        status = death_message(self.process.exitcode)
        if self.failed:
            return f"{status}: {self.failed}"
        try:
            lines = [ln.strip() for ln in Path(self.log).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        if lines:
            return f"{status}; its stderr ended: {' | '.join(lines[-START_LOG_LINES:])[:400]}"
        return f"{status}, having printed nothing"

    def forget_log(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.log)

    def running(self) -> Task | None:
        """The task the worker is in now, as it published it (None: between tasks)."""
        if self.state[1] == IDLE:
            return None
        index = int(self.state[0])
        return next((t for t in self.queue if t.index == index), None)


class WorkerPool:
    """One worker process per device slot, each with a short queue; crash- and hang-proof."""

    def __init__(
        self,
        *,
        devices: list[str],
        timeout: float,
        redzone: bool = False,
        table_ref: str = DEFAULT_TABLE,
        depth: int = QUEUE_DEPTH,
    ) -> None:
        if not devices:
            raise ValueError("WorkerPool: devices=[] must name at least one device")
        self._table_ref = table_ref
        self._table = table_from_ref(table_ref)
        self._ctx = context()
        self._timeout = timeout
        self._redzone = redzone
        self._depth = depth
        self._start_failures = 0
        self._size = len(devices)
        self._held: frozenset[tuple[str, str, str]] = frozenset()
        self._orphans: collections.deque[Task] = collections.deque()  # queued on a worker that died
        self._restarts = 0
        # What wait() watches (each worker's pipe and process sentinel), kept between calls and
        # rebuilt only when a worker is replaced: building it per call, and a poll per message,
        # were most of the parent's own time per case.
        self._watching: selectors.BaseSelector | None = None
        if redzone and any(d.startswith("cuda") for d in devices):
            # Built here, once, before any worker starts: N workers starting on a cold cache each
            # compiled it at once, into one shared temporary file (memory/redzone.py), and the
            # losers of that race died at start-up.
            from mlafuzz.harness.memory import redzone as rzmod

            try:
                rzmod.build()
            except Exception as exc:  # noqa: BLE001 - nvcc missing or failing: one line, exit 2
                text = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()
                raise WorkerStartError(
                    f"--redzone: cannot build the red-zone allocator: {type(exc).__name__}: {text[-1] if text else ''}"
                ) from None
        self._workers = [self._start(d) for d in devices]

    def _start(self, device: str) -> _Worker:
        parent, child = self._ctx.Pipe()
        state = self._ctx.RawArray("d", 3)
        threads = max(1, (os.cpu_count() or 1) // max(1, self._size))
        fd, log = tempfile.mkstemp(prefix="mlafuzz-worker-", suffix=".log")
        os.close(fd)
        proc = self._ctx.Process(
            target=entry,
            args=(
                environment(),
                WORKER_MAIN,
                child,
                state,
                device,
                self._redzone,
                threads,
                self._table_ref,
                os.getpid(),
                log,
            ),
            daemon=True,
            name=f"mlafuzz-{device}",
        )
        proc.start()
        child.close()
        worker = _Worker(device=device, process=proc, conn=parent, state=state, log=log)
        if self._held:
            self._send(worker, ("quarantine", self._held))
        return worker

    @staticmethod
    def _send(worker: _Worker, message: Any) -> bool:
        try:
            worker.conn.send(message)
            return True
        except (OSError, BrokenPipeError):
            return False  # it died: wait() notices and replaces it

    def free_slots(self) -> int:
        if self._orphans:
            return 0  # the orphans go first (see wait)
        return sum(self._depth - len(w.queue) for w in self._workers if w.ready)

    def in_flight(self) -> int:
        return sum(len(w.queue) for w in self._workers) + len(self._orphans)

    def submit(self, task: Task) -> None:
        worker = min((w for w in self._workers if w.ready and len(w.queue) < self._depth), key=lambda w: len(w.queue))
        task = _on_device(task, worker.device)
        worker.queue.append(task)
        self._send(worker, ("task", task))

    def quarantine(self, classes: frozenset[tuple[str, str, str]]) -> None:
        """From now on, no worker runs these (op, impl, error-input class) triples, queued tasks too."""
        self._held = classes
        for w in self._workers:
            self._send(w, ("quarantine", classes))

    def drop_queued(self) -> list[Task]:
        """Take back every task no worker has started (the orphans too); the running ones go on.
        A task a worker starts just as it is taken back runs, and its result is ignored."""
        dropped = list(self._orphans)
        self._orphans.clear()
        for worker in self._workers:
            running = worker.running()
            queued = [t for t in worker.queue if t is not running]
            if queued:
                worker.queue = collections.deque(t for t in worker.queue if t is running)
                self._send(worker, ("drop", frozenset(t.index for t in queued)))
                dropped += queued
        return dropped

    def cancel(self) -> None:
        """Drop every task in flight: a worker holding one is replaced (a shrink out of time must
        not wait for a case that hangs)."""
        self._orphans.clear()
        for worker in list(self._workers):
            if worker.queue:
                worker.queue.clear()
                self._replace(worker)

    def _replace(self, worker: _Worker, *, lost: Task | None = None) -> None:
        """Kill and restart ``worker``; the tasks it had queued (but ``lost``) go to the others."""
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()
        worker.forget_log()
        self._orphans.extend(t for t in worker.queue if t is not lost)
        self._workers[self._workers.index(worker)] = self._start(worker.device)
        self._unwatch()
        self._restarts += 1

    def restarts(self) -> int:
        return self._restarts

    def _lost(
        self, worker: _Worker, task: Task, part: int, kind: Kind, message: str, since: float
    ) -> tuple[Task, TaskResult]:
        finding = lost_finding(
            task=task, part=part, kind=kind, message=message, device=worker.device, table=self._table
        )
        self._replace(worker, lost=task)
        return task, TaskResult(findings=(finding,), seconds=time.monotonic() - since)

    def _watch(self) -> selectors.BaseSelector:
        """The selector over every worker's pipe and sentinel (data: (worker, is the sentinel))."""
        if self._watching is None:
            self._watching = selectors.DefaultSelector()
            for w in self._workers:
                self._watching.register(w.conn, selectors.EVENT_READ, (w, False))
                self._watching.register(w.process.sentinel, selectors.EVENT_READ, (w, True))
        return self._watching

    def _unwatch(self) -> None:
        if self._watching is not None:
            self._watching.close()
            self._watching = None

    def _drain(self, worker: _Worker, out: list[tuple[Task, TaskResult]]) -> bool:
        """Read the worker's messages; True when it asked to retire."""
        retire = False
        try:
            while _readable(worker.conn):
                tag, payload = worker.conn.recv()
                if tag == "ready":
                    worker.ready = True
                    self._start_failures = 0
                elif tag == "failed":
                    worker.failed = payload
                elif tag == "result":
                    index, wire, retire = payload
                    task = next((t for t in worker.queue if t.index == index), None)
                    if task is not None:
                        worker.queue.remove(task)
                        out.append((task, TaskResult.from_wire(wire)))
        except (EOFError, OSError):
            pass
        return retire

    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]:
        out: list[tuple[Task, TaskResult]] = []
        while self._orphans and any(w.ready and len(w.queue) < self._depth for w in self._workers):
            self.submit(self._orphans.popleft())
        events = [key.data for key, _ in self._watch().select(timeout)]  # (worker, its sentinel fired)
        exited = {id(w) for w, sentinel in events if sentinel}
        for worker in {id(w): w for w, _ in events}.values():
            if self._drain(worker, out):  # its CUDA context broke: it is exiting; start its successor now
                self._replace(worker)
                continue
            if id(worker) not in exited:
                continue
            worker.process.join(timeout=1)
            self._drain(worker, out)  # results it sent before it died count
            running, part, since = worker.running(), int(worker.state[1]), worker.state[2]
            if running is not None:
                out.append(
                    self._lost(
                        worker,
                        running,
                        part,
                        Kind.CRASH,
                        f"{death_message(worker.process.exitcode)} while running this case on {worker.device}",
                        since,
                    )
                )
                continue
            if not worker.ready:
                self._start_failures += 1
                if self._start_failures >= MAX_START_FAILURES:
                    why = worker.start_error()
                    worker.forget_log()
                    raise WorkerStartError(
                        f"worker processes on {worker.device} die before they are ready "
                        f"({self._start_failures} times; the last: {why}); --in-process shows it directly"
                    )
            self._replace(worker)  # died while idle or starting: bring up another
        now = time.monotonic()
        for worker in list(self._workers):
            running, part = worker.running(), int(worker.state[1])
            limit = max(self._timeout, LOAD_SECONDS) if part == LOADING else self._timeout
            if running is not None and now - worker.state[2] > limit:
                out.append(
                    self._lost(
                        worker,
                        running,
                        part,
                        Kind.TIMEOUT,
                        f"no result after {limit:.0f} s on {worker.device}; worker killed",
                        worker.state[2],
                    )
                )
        return out

    def close(self) -> None:
        for w in self._workers:
            self._send(w, None)
        deadline = time.monotonic() + 3
        for w in self._workers:
            if not w.ready:  # still starting (a replacement): it holds no work and reads no message yet
                w.process.kill()
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=2)
            w.conn.close()
            w.forget_log()
        self._workers = []
        self._unwatch()


def _readable(conn: Connection) -> bool:
    """A message (or the pipe's end) waits on ``conn``: one poll of its descriptor, where
    ``conn.poll()`` builds and tears down a selector each time (poll, not select: no descriptor
    limit of 1024)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def _on_device(task: Task, device: str) -> Task:
    import dataclasses

    return dataclasses.replace(task, device=device)
