"""The worker process: its start (parent-death signal, no core files, warm-up), how it says why
it died before it was ready, and its serving loop.

Workers are forked from a server that imported torch, or spawned (``context``); never forked
after CUDA is initialised. Each
holds a short queue of tasks (so it never waits on the parent between cases) and publishes, in a
few words of shared memory (``phases``), which task it is running, which part of it and since
when: the parent charges a death or a hang to that part (``crash``, ``pool``).

Workers end with their parent: a parent-death signal (Linux) and a watchdog on the parent's pid,
so a ``kill -9`` of the run leaves no worker holding the GPU. They ignore SIGINT and SIGTERM (the
parent handles both and shuts them down), and a lost pipe ends them quietly.

A worker that dies before it is ready says why: it sends its start-up error (or a plain
SystemExit) over its pipe, and what it wrote to stderr while starting goes to a small file the
parent reads back; either names the cause in the one-line WorkerStartError.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterator

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.tasks import Task, execute
from mlafuzz.harness.drive.workers.crash import charge_broken_context, cuda_broken, memory_unsafe_run
from mlafuzz.harness.drive.workers.phases import CONTRACT, IDLE, LOADING, PHASES, VALID
from mlafuzz.harness.drive.workers.protocol import strip_quarantined, table_from_ref
from mlafuzz.harness.memory.share import GpuShare
from mlafuzz.harness.ops.names import NEWEST_REVISION


def _die_with_parent(parent: int) -> None:
    """End this process when the run's process ``parent`` does: PR_SET_PDEATHSIG where the kernel
    has it (it fires when this process's own parent exits: the run, or the fork server, which exits
    with the run), and a watchdog thread that polls ``parent`` everywhere (a parent killed with -9
    runs no cleanup; its workers must not linger on the GPU)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    direct = os.getppid()  # the run (spawned) or the fork server (forked from it)
    if not _alive(parent):  # it died before the signal was armed
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != direct or not _alive(parent):
                os._exit(0)

    threading.Thread(target=watch, name="mlafuzz-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A parent killed with -9 stays a zombie until its own parent reaps
    it, and a caller reading this worker's output reaps it only once that output ends: so a zombie
    counts as gone, where /proc says so."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):
        pass  # no /proc here: whether the number exists at all
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone; or the number is someone else's now
        return False
    return True


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


def worker_main(
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

    early: list[str | None] = [None]  # the valid part's broken context, pinned before the error input runs

    def phase(part: str) -> None:
        code = PHASES.get(part, CONTRACT)
        if code == CONTRACT and device.startswith("cuda"):
            # One sync, and only for tasks with an error input: a break seen here is the valid case's,
            # one seen after the task is the error input's (charge_broken_context names it).
            early[0] = cuda_broken(device)
        state[1] = code

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
        early[0] = None
        result = execute(task, session, on_phase=phase, hold=share.case if share is not None else None)
        broken = early[0] or (cuda_broken(device) if device.startswith("cuda") else None)
        if broken is not None:
            in_contract = early[0] is None and state[1] == CONTRACT
            result = charge_broken_context(task, result, broken, session.table, in_contract=in_contract)
        # An illegal address leaves the process's CUDA context unusable (every later case would
        # fail here), and an accepted memory-unsafe error input may have damaged its heap (a later
        # valid case would crash for it): either way this worker takes no other case.
        retire = broken is not None or memory_unsafe_run(task, result, session.table)
        state[1] = IDLE
        # "retire" rides on the result itself: the pool must never hand this worker another task.
        conn.send(("result", (task.index, result.to_wire(), retire)))
        if retire:  # exit; the pool replaces this worker with a fresh process
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
