"""``--sanitizer``: run cases under compute-sanitizer memcheck and turn its reports into findings.

Tasks run in batches inside ``compute-sanitizer --tool memcheck python -m
mlafuzz.harness.sanitizer``, with PyTorch's caching allocator off
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
from dataclasses import asdict
from pathlib import Path

from mlafuzz.harness.findings import Finding, Kind
from mlafuzz.harness.tasks import Task, TaskResult, execute

MARKER = "@@mlafuzz-task "
_ERROR = re.compile(r"=+ (Invalid __global__ (write|read)|Out-of-range|Address .* is out of bounds|"
                    r"Misaligned|Program hit|Malloc|Illegal)[^\n]*")


def sanitizer_path() -> str:
    path = shutil.which("compute-sanitizer") or next(
        (str(p) for p in Path("/usr/local/cuda/bin").glob("compute-sanitizer") if p.exists()), None)
    if path is None:
        raise RuntimeError("--sanitizer needs compute-sanitizer on PATH (CUDA toolkit)")
    return path


def parse_report(text: str) -> dict[int, list[str]]:
    """memcheck error headlines per task index, from the child's combined output."""
    errors: dict[int, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(MARKER):
            current = int(line[len(MARKER):].split()[0])
            continue
        m = _ERROR.search(line)
        if m and current is not None:
            errors.setdefault(current, []).append(m.group(0).strip("= ").strip())
    return errors


class SanitizerExecutor:
    """Runs batches of tasks in one compute-sanitizer child; slow, exact, no allocator tricks."""

    def __init__(self, *, device: str, batch: int = 16, timeout: float = 600.0) -> None:
        self._tool = sanitizer_path()
        self._device, self._batch, self._timeout = device, batch, timeout
        self._pending: list[Task] = []

    def free_slots(self) -> int:
        return max(0, self._batch - len(self._pending))

    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, task: Task) -> None:
        self._pending.append(task)

    def wait(self, timeout: float) -> list[tuple[Task, TaskResult]]:
        if not self._pending:
            time.sleep(min(timeout, 0.05))
            return []
        batch, self._pending = self._pending, []
        return self._run(batch)

    def close(self) -> None:
        self._pending = []

    def _run(self, batch: list[Task]) -> list[tuple[Task, TaskResult]]:
        with tempfile.TemporaryDirectory(prefix="mlafuzz-san-") as tmp:
            tasks_file, results_file = Path(tmp) / "tasks.jsonl", Path(tmp) / "results.jsonl"
            tasks_file.write_text("".join(json.dumps(asdict(t)) + "\n" for t in batch))
            env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
            cmd = [self._tool, "--tool", "memcheck", "--print-limit", "200", sys.executable, "-m",
                   "mlafuzz.harness.sanitizer", str(tasks_file), str(results_file)]
            start = time.monotonic()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=self._timeout)
                text, died = proc.stdout + "\n" + proc.stderr, proc.returncode != 0
            except subprocess.TimeoutExpired as exc:
                text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                died = True
            results = {}
            if results_file.exists():
                for line in results_file.read_text().splitlines():
                    if line.strip():
                        data = json.loads(line)
                        results[data["index"]] = TaskResult.from_wire(data["result"])
        errors = parse_report(text)
        out = []
        for task in batch:
            result = results.get(task.index)
            extra = [Finding(kind=Kind.OOB_WRITE if "write" in e.lower() else Kind.CRASH, op=task.op,
                             impl=task.impl_ref, case_id=task.case_id, seed=task.seed, spec=task.spec,
                             cause=f"sanitizer:{e.split(' of size')[0].split(' at ')[0][:60]}",
                             message=f"compute-sanitizer memcheck: {e}")
                     for e in errors.get(task.index, [])[:3]]
            if result is None:
                why = "timed out" if not died else "died"
                result = TaskResult(findings=(Finding(
                    kind=Kind.CRASH, op=task.op, impl=task.impl_ref, case_id=task.case_id, seed=task.seed,
                    spec=task.spec, cause="crash", message=f"sanitizer child {why} before this case finished"),),
                    seconds=time.monotonic() - start)
            out.append((task, TaskResult(findings=result.findings + tuple(extra), skipped=result.skipped,
                                         seconds=result.seconds)))
        return out


def _child(tasks_file: Path, results_file: Path) -> None:
    import torch

    with open(results_file, "a", encoding="utf-8") as out:
        for line in tasks_file.read_text().splitlines():
            task = Task(**{k: (tuple(v) if k == "rejects" and v is not None else v)
                           for k, v in json.loads(line).items()})
            print(f"{MARKER}{task.index}", flush=True)
            result = execute(task)
            torch.cuda.synchronize()
            print(f"{MARKER}{task.index} done", flush=True)
            out.write(json.dumps({"index": task.index, "result": result.to_wire()}) + "\n")
            out.flush()


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
