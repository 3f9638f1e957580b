"""``--sanitizer``: run cases under compute-sanitizer memcheck and turn its reports into findings.

Tasks run in batches inside ``compute-sanitizer --tool memcheck python -m
mlafuzz.harness.drive.sanitizer``, with PyTorch's caching allocator off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that every tensor is its own allocation
and a write past one is a write into no allocation. The child prints a marker
line before each task; every memcheck error is charged to the task whose
marker precedes it. Tasks with no result (the child died) become CRASH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from mlafuzz.generators.draw import Knobs
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.tasks import HARNESS_ERROR, Task, TaskResult, execute
from mlafuzz.harness.drive.workers import strip_quarantined
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.findings import Kind

MARKER = "@@mlafuzz-task "
_ERROR = re.compile(
    r"=+ (Invalid __global__ (write|read)|Out-of-range|Address .* is out of bounds|"
    r"Misaligned|Program hit|Malloc|Illegal)[^\n]*"
)


def sanitizer_path() -> str:
    path = shutil.which("compute-sanitizer") or next(
        (str(p) for p in Path("/usr/local/cuda/bin").glob("compute-sanitizer") if p.exists()), None
    )
    if path is None:
        raise RuntimeError("--sanitizer needs compute-sanitizer on PATH (CUDA toolkit)")
    return path


def parse_report(text: str) -> dict[int, list[str]]:
    """memcheck error headlines per task index, from the child's combined output."""
    errors: dict[int, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(MARKER):
            current = int(line[len(MARKER) :].split()[0])
            continue
        m = _ERROR.search(line)
        if m and current is not None:
            errors.setdefault(current, []).append(m.group(0).strip("= ").strip())
    return errors


class SanitizerExecutor:
    """Runs batches of tasks in compute-sanitizer children; slow, exact, no allocator tricks.

    A memcheck error leaves the child's CUDA context broken, so a child usually
    dies at the case that made the error: that case is charged (its sanitizer
    report plus a CRASH), and the cases after it run again in a fresh child.
    """

    def __init__(
        self, *, device: str, batch: int = 16, timeout: float = 600.0, tool_cmd: list[str] | None = None
    ) -> None:
        self._cmd = (
            tool_cmd if tool_cmd is not None else [sanitizer_path(), "--tool", "memcheck", "--print-limit", "200"]
        )
        self._device, self._batch, self._timeout = device, batch, timeout
        self._pending: list[Task] = []
        self._held: frozenset[tuple[str, str, str]] = frozenset()
        self._restarts = 0  # children that died with cases of their batch left to run

    def free_slots(self) -> int:
        return max(0, self._batch - len(self._pending))

    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, task: Task) -> None:
        self._pending.append(strip_quarantined(task, self._held))

    def quarantine(self, classes: frozenset[tuple[str, str, str]]) -> None:
        self._held = classes

    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]:
        if not self._pending:
            time.sleep(min(timeout, 0.05))
            return []
        batch, self._pending = self._pending, []
        out: list[tuple[Task, TaskResult]] = []
        while batch:
            done, batch = self._run_child(batch)
            out += done
            self._restarts += bool(batch)
        return out

    def restarts(self) -> int:
        return self._restarts

    def cancel(self) -> None:
        self._pending = []

    def close(self) -> None:
        self._pending = []

    def _run_child(self, batch: list[Task]) -> tuple[list[tuple[Task, TaskResult]], list[Task]]:
        """Run ``batch`` in one child: (results for the cases it settled, the cases to run again)."""
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="mlafuzz-san-") as tmp:
            tasks_file, results_file = Path(tmp) / "tasks.jsonl", Path(tmp) / "results.jsonl"
            tasks_file.write_text("".join(json.dumps(asdict(t)) + "\n" for t in batch))
            env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
            cmd = [
                *self._cmd,
                sys.executable,
                "-m",
                "mlafuzz.harness.drive.sanitizer",
                str(tasks_file),
                str(results_file),
            ]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=self._timeout)
                text, why = proc.stdout + "\n" + proc.stderr, "died"
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                text, why = out, f"timed out after {self._timeout:.0f} s"
            results = {}
            if results_file.exists():
                for line in results_file.read_text().splitlines():
                    if line.strip():
                        data = json.loads(line)
                        results[data["index"]] = TaskResult.from_wire(data["result"])
        errors = parse_report(text)
        started = {int(line[len(MARKER) :].split()[0]) for line in text.splitlines() if line.startswith(MARKER)}
        settled: list[tuple[Task, TaskResult]] = []
        retry: list[Task] = []
        for task in batch:
            result = results.get(task.index)
            if result is None and task.index not in started:
                retry.append(task)  # never reached: the child died earlier
                continue
            ctx = task.resolve(OPS).context()  # the spec drawn once for all of this case's findings
            extra = tuple(
                ctx.finding(
                    None,
                    f"sanitizer:{e.split(' of size')[0].split(' at ')[0][:60]}",
                    kind=_kind(e),
                    message=f"compute-sanitizer memcheck: {e}",
                )
                for e in errors.get(task.index, [])[:3]
            )
            if result is None:
                result = TaskResult(
                    findings=(
                        ctx.finding(
                            None,
                            "crash",
                            kind=Kind.CRASH,
                            message=f"sanitizer child {why} while running this case",
                        ),
                    ),
                    seconds=time.monotonic() - start,
                )
            settled.append(
                (
                    task,
                    TaskResult(
                        findings=result.findings + extra,
                        skipped=result.skipped,
                        seconds=result.seconds,
                        features=result.features,
                        spec=result.spec,
                    ),
                )
            )
        if retry and not settled:  # the child died before any case: do not loop forever
            settled = [
                (
                    t,
                    TaskResult(
                        findings=(
                            replace(t.resolve(OPS).context(), spec=t.spec).finding(
                                None,
                                HARNESS_ERROR,
                                kind=Kind.CRASH,
                                message=f"sanitizer child {why} before running any case: "
                                f"{text.strip().splitlines()[-1] if text.strip() else ''}",
                            ),
                        )
                    ),
                )
                for t in retry
            ]
            retry = []
        return settled, retry


def _kind(error: str) -> Kind:
    text = f" {error.lower()} "
    return Kind.OOB_WRITE if " write " in text else Kind.OOB_READ if " read " in text else Kind.CRASH


def task_from_json(data: dict) -> Task:
    """A Task back from ``dataclasses.asdict`` through JSON (tuples came back as lists)."""
    knobs = data.get("knobs") or {}
    knobs = Knobs(**{k: tuple(v) if isinstance(v, list) else v for k, v in knobs.items()})
    rejects = data.get("rejects")
    declared = tuple(data.get("declared") or ())
    return Task(
        **{**data, "knobs": knobs, "rejects": tuple(rejects) if rejects is not None else None, "declared": declared}
    )


def _child(tasks_file: Path, results_file: Path) -> None:
    import torch

    session = Session(table=OPS)
    with open(results_file, "a", encoding="utf-8") as out:
        for line in tasks_file.read_text().splitlines():
            task = task_from_json(json.loads(line))
            print(f"{MARKER}{task.index}", flush=True)
            result = execute(task, session)
            if task.device.startswith("cuda"):
                torch.cuda.synchronize()
            print(f"{MARKER}{task.index} done", flush=True)
            out.write(json.dumps({"index": task.index, "result": result.to_wire()}) + "\n")
            out.flush()


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
