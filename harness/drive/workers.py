"""Executors: run tasks in-process, or in spawned worker processes that may die.

Workers are started with the ``spawn`` method (never fork after CUDA is
initialised), one per device slot. Each holds a short queue of tasks (so it
never waits on the parent between cases) and publishes, in a few words of
shared memory, which task it is running, which part of it (the valid case or
its error input) and since when. So a worker that dies (illegal address,
abort, segfault) yields a CRASH finding for the task and part it held, one
that exceeds the task timeout is killed and yields TIMEOUT, and the tasks
queued behind it go to the other workers. Either way it is replaced and the
run goes on.

Workers end with their parent: a parent-death signal (Linux) and a watchdog
on the parent's pid, so a ``kill -9`` of the run leaves no worker holding the
GPU. They ignore SIGINT and SIGTERM (the parent handles both and shuts them
down), and a lost pipe ends them quietly.

A worker that dies before it is ready says why: it sends its start-up error
(or a plain SystemExit) over its pipe, and what it wrote to stderr while
starting goes to a small file the parent reads back; either names the cause in
the one-line WorkerStartError (a pipe error in start-up is no longer taken for
"the parent went away": that swallowed every OSError, and a worker so ended
exited with status 0 and said nothing).

A case's time limit runs from the moment its worker starts it, after the
worker's one-time costs: its warm-up (imports, the word pool) before it is
ready, and the loading of each implementation before its first case with it
(timed apart, under LOAD_SECONDS). A short --timeout is not spent on them.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import importlib
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.tasks import AFTER_CALL, HARNESS_ERROR, Task, TaskResult, execute
from mlafuzz.harness.memory.share import GpuShare
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.reports.findings import Kind

DEFAULT_TABLE = "mlafuzz.harness.ops.table:OPS"
QUEUE_DEPTH = 3  # tasks a worker holds: it starts the next case as soon as one is done
MAX_START_FAILURES = 3
IDLE, VALID, CONTRACT, LOADING = 0, 1, 2, 3  # the part of a task a worker is in (shared with the parent)
# How long a worker may take to load an implementation (import it, check its signature) before its
# first case with it; the case's own --timeout starts after. An import of vLLM or Triton takes
# seconds, and charged to the first case of every fresh worker under a short --timeout it made a
# TIMEOUT, whose restart made the next one, and so on.
LOAD_SECONDS = 120.0
PHASES = {"valid": VALID}
START_LOG_LINES = 3  # lines of a dead worker's start-up stderr its WorkerStartError quotes


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


# --- the worker process ----------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """End this process when its parent does: PR_SET_PDEATHSIG where the kernel has it, and a
    watchdog thread that polls the parent's pid everywhere (a parent killed with -9 runs no
    cleanup; its workers must not linger on the GPU)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="mlafuzz-parent-watch", daemon=True).start()


def _no_core_files() -> None:
    """A crashing worker writes no core file (``MLAFUZZ_CORE_DUMPS=1`` keeps the system's limit):
    crashes are what a fuzzer's workers are for, and the core of a process holding a CUDA context
    runs to gigabytes, whose writing would cost each crash far more than the restart itself."""
    if os.environ.get("MLAFUZZ_CORE_DUMPS") == "1":
        return
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, ValueError, OSError):
        pass


def _worker_main(
    conn: Connection,
    state: Any,
    device: str,
    redzone: bool,
    threads: int,
    table_ref: str,
    parent: int,
    log: str | None = None,
) -> None:
    _die_with_parent(parent)
    _no_core_files()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and CI's SIGTERM are the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with _start_log(log) if log is not None else contextlib.nullcontext():
            serve = _prepare(state, device, redzone, threads, table_ref)
    except BaseException as exc:  # SystemExit too: an import that exits must not pass for "ready"
        _report_start_failure(conn, exc)
        os._exit(1)
    try:
        conn.send(("ready", None))
        serve(conn)
    except (EOFError, OSError, BrokenPipeError, ConnectionResetError):
        pass  # the parent went away: nothing to report to, nothing to print
    os._exit(0)


@contextlib.contextmanager
def _start_log(path: str) -> Iterator[None]:
    """Send this process's stderr (fd 2: C libraries, the CUDA driver, Python warnings alike) to
    ``path`` while it starts, then replay it to the real stderr: the parent reads the file back
    only when the worker dies before it is ready, to say why."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    try:  # started: what it said goes where it always went
        text = Path(path).read_text(errors="replace")
        os.unlink(path)
    except OSError:
        text = ""
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def _report_start_failure(conn: Connection, exc: BaseException) -> None:
    """Print the start-up error and send it, as one line, to the parent (best effort both)."""
    if isinstance(exc, SystemExit):
        line = f"it called sys.exit({exc.code!r}) while starting"
    else:
        text = str(exc).strip().splitlines()
        line = f"{type(exc).__name__}: {text[0] if text else ''}".strip()
        frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ is not None else []
        if frame:
            line += f" (at {frame[0].filename}:{frame[0].lineno})"
    traceback.print_exception(exc)
    sys.stderr.flush()
    try:
        conn.send(("failed", line))
    except Exception:  # noqa: BLE001 - the parent then reads the start-up log instead
        pass


def _prepare(state: Any, device: str, redzone: bool, threads: int, table_ref: str) -> Callable[[Connection], None]:
    """Everything a worker does once before it is ready; returns its serving loop."""
    # TRITON_INTERPRET was decided by the parent's entry point and is inherited: nothing to set here.
    import torch

    from mlafuzz.generators.rng.pool import word_pool

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
    # Huge cases take turns on a GPU; under the red-zone allocator there is no cache to trim.
    share = GpuShare(device, caching=rz is None) if device.startswith("cuda") else None
    # Every case reads the word pool: built here, its cost is start-up's, not the first case's
    # (on a loaded machine it alone could run past a short --timeout).
    word_pool(device)

    def serve(conn: Connection) -> None:
        _serve(conn, state, device, session, share)

    return serve


def _serve(conn: Connection, state: Any, device: str, session: Session, share: GpuShare | None) -> None:
    held: frozenset[tuple[str, str, str]] = frozenset()
    queue: collections.deque[Task] = collections.deque()

    loaded: set[tuple[str, str]] = set()

    def phase(part: str) -> None:
        state[1] = PHASES.get(part, CONTRACT)

    def publish(index: int, part: int) -> None:
        # The start time first, the part last: the parent reads "running since" only once the
        # part says a task runs, so it never pairs this task with the last one's start.
        state[2] = time.monotonic()
        state[0] = float(index)
        state[1] = part

    while True:
        # Read everything the parent sent, so a quarantine or a drop that arrived behind queued
        # tasks applies to them; block only when there is nothing to run.
        while conn.poll() or not queue:
            message = conn.recv()
            if message is None:
                return
            tag, payload = message
            if tag == "task":
                queue.append(payload)
            elif tag == "quarantine":
                held = payload
            elif tag == "drop":
                queue = collections.deque(t for t in queue if t.index not in payload)
        if not queue:
            continue
        task = strip_quarantined(queue.popleft(), held)
        if (task.op, task.impl_ref) not in loaded:
            loaded.add((task.op, task.impl_ref))
            publish(task.index, LOADING)
            _load(session, task)
        publish(task.index, VALID)
        result = execute(task, session, on_phase=phase, hold=share.case if share is not None else None)
        broken = _cuda_broken(device) if device.startswith("cuda") else None
        if broken is not None:
            result = charge_broken_context(task, result, broken, session.table)
        state[1] = IDLE
        # "retire" rides on the result itself: the pool must never hand this worker another task.
        conn.send(("result", (task.index, result.to_wire(), broken is not None)))
        if broken is not None:
            # An illegal address leaves the process's CUDA context unusable: every later case
            # would fail here. Exit; the pool replaces this worker with a fresh process.
            conn.close()
            os._exit(3)


def _load(session: Session, task: Task) -> None:
    """Load ``task``'s implementation ahead of its first case (the session keeps it); a failure is
    left for the case to meet and report as it always does."""
    try:
        entry = session.entry(task.op, task.impl_ref, rejects=task.rejects, features=task.declared)
        session.load(entry, task.device, revision=entry.judged_under(task.revision or NEWEST_REVISION))
    except Exception:  # noqa: BLE001, S110 - execute() raises it again and makes it a finding
        pass


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
    kept; dropped, what the broken context explains: harness errors, and the fault itself surfacing
    in the harness's next CUDA op, which alone would read as a LAUNCH_ERROR)."""
    kept = tuple(f for f in result.findings if f.cause not in (HARNESS_ERROR, AFTER_CALL))
    crash = (
        task.resolve(table)
        .context()
        .finding(
            None,
            "cuda_context",
            kind=Kind.CRASH,
            message=f"the CUDA context broke during this case ({error}); worker replaced",
        )
    )
    return TaskResult(
        findings=kept + (crash,),
        skipped=result.skipped,
        seconds=result.seconds,
        features=result.features,
        spec=result.spec,
    )


def _death_message(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker died"
    if exitcode < 0:
        try:
            return f"worker killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with status {exitcode}"


# --- the pool ----------------------------------------------------------------------


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
        status = _death_message(self.process.exitcode)
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
    """One spawned worker per device slot, each with a short queue; crash- and hang-proof."""

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
        self._ctx = mp.get_context("spawn")
        self._timeout = timeout
        self._redzone = redzone
        self._depth = depth
        self._start_failures = 0
        self._size = len(devices)
        self._held: frozenset[tuple[str, str, str]] = frozenset()
        self._orphans: collections.deque[Task] = collections.deque()  # queued on a worker that died
        self._restarts = 0
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
            target=_worker_main,
            args=(child, state, device, self._redzone, threads, self._table_ref, os.getpid(), log),
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
        self._restarts += 1

    def restarts(self) -> int:
        return self._restarts

    def _lost(
        self, worker: _Worker, task: Task, part: int, kind: Kind, message: str, since: float
    ) -> tuple[Task, TaskResult]:
        resolved = task.resolve(self._table)  # once: the finding's spec and case id come from it
        if part == CONTRACT and task.contract:
            cause = f"contract:{task.contract}:{kind.value.lower()}"
            message = f"{message} (in its error input {task.contract})"
        elif part == LOADING:
            cause = f"load:{kind.value.lower()}"
            message = f"{message} (loading the implementation, before the case)"
        else:
            cause = kind.value.lower()
        finding = resolved.context().finding(
            None,
            cause,
            kind=kind,
            message=message,
            extra={
                "device": worker.device,
                "part": "contract" if part == CONTRACT else "valid",
                **({"invalid_class": task.contract} if part == CONTRACT else {}),
            },
        )
        self._replace(worker, lost=task)
        return task, TaskResult(findings=(finding,), seconds=time.monotonic() - since)

    def _drain(self, worker: _Worker, out: list[tuple[Task, TaskResult]]) -> bool:
        """Read the worker's messages; True when it asked to retire."""
        retire = False
        try:
            while worker.conn.poll():
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
        watch = {w.conn: w for w in self._workers}
        watch.update({w.process.sentinel: w for w in self._workers})
        ready = wait(list(watch), timeout=timeout)
        seen: set[int] = set()
        for handle in ready:
            worker = watch[handle]
            if id(worker) in seen:
                continue
            seen.add(id(worker))
            if self._drain(worker, out):  # its CUDA context broke: it is exiting; start its successor now
                self._replace(worker)
                continue
            if worker.process.is_alive():
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
                        f"{_death_message(worker.process.exitcode)} while running this case on {worker.device}",
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


def _on_device(task: Task, device: str) -> Task:
    import dataclasses

    return dataclasses.replace(task, device=device)


# The default worker count per GPU (``slot_plan``): the host's cores shared among the GPUs (one
# kept for the parent's loop), the GPU's memory over what a worker may hold, and a cap: a
# fuzz case is host-bound (~1 ms of Python per case), so workers scale with cores until the GPU's
# queue or the parent's loop saturates. WORKER_CAP is the knee measured on the H200 (README).
WORKER_CAP = 8
WORKER_BYTES = 9 << 30  # a worker's CUDA context and cached memory: it trims to share.TRIM_BYTES (8 GiB)


@dataclass(frozen=True, kw_only=True)
class SlotPlan:
    """How many workers a device gets, and the numbers that decided it (the run's header)."""

    per_device: int
    devices: int
    cores: int
    memory_bytes: int  # the smallest memory of the devices (0: not a GPU)
    chosen: bool  # the user gave --workers

    def line(self, slots: list[str]) -> str:
        """The header's worker line: '8 workers on cuda:0 (16 cores, 139 GiB free: ...)'."""
        n = len(slots)
        head = f"{n} worker{'s' if n != 1 else ''} on {','.join(dict.fromkeys(slots))}"
        if self.chosen:
            return head + " (--workers)"
        if not self.memory_bytes:
            return head + " (--workers N for more)"
        return (
            f"{head} ({self.cores} cores, {self.memory_bytes / (1 << 30):.0f} GiB: per GPU min(cores - 1 over"
            f" GPUs, memory / {WORKER_BYTES >> 30} GiB, {WORKER_CAP}); --workers N to change)"
        )


def plan_slots(*, gpus: int, cores: int, memory_bytes: int, cap: int = WORKER_CAP) -> int:
    """Workers per GPU for a run without --workers: min(the cores each GPU gets, one kept for the
    parent; the memory of the smallest GPU over WORKER_BYTES; ``cap``), at least 1."""
    per_gpu_cores = (max(cores - 1, 1)) // max(gpus, 1)
    by_memory = memory_bytes // WORKER_BYTES
    return max(1, min(per_gpu_cores, by_memory, cap))


def host_cores() -> int:
    """The cores this process may run on (a container's CPU set, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def slot_plan(*, device: str, workers: int | None) -> SlotPlan:
    """The worker count ``device_slots`` uses, with its reasons."""
    cores = host_cores()
    if device != "cuda":
        return SlotPlan(per_device=workers or 1, devices=1, cores=cores, memory_bytes=0, chosen=workers is not None)
    import torch

    count = torch.cuda.device_count()
    if workers is not None:
        return SlotPlan(per_device=1, devices=workers, cores=cores, memory_bytes=0, chosen=True)
    # The GPUs' sizes, not their free memory: asking that would open a CUDA context on every GPU in
    # this process for the whole run (workers share a GPU's memory through memory/share.py).
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    per = plan_slots(gpus=count, cores=cores, memory_bytes=memory)
    return SlotPlan(per_device=per, devices=count, cores=cores, memory_bytes=memory, chosen=False)


def device_slots(*, device: str, workers: int | None, plan: SlotPlan | None = None) -> list[str]:
    """Device strings for the workers: ``workers`` processes spread over the GPUs, or without it
    ``plan_slots``' count on each GPU (1 on the CPU: the interpreter's cases are CPU-bound)."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        plan = plan or slot_plan(device=device, workers=workers)
        n = workers or plan.per_device * count
        return [f"cuda:{i % count}" for i in range(n)]
    return ["cpu"] * (workers or 1)
