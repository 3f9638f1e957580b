"""Crash handling: what a worker's death, a hang, or a broken CUDA context is charged to.

A worker that dies (illegal address, abort, segfault) yields a CRASH finding for the task and
the part of it (the valid case, its error input, the loading of its implementation) it held; one
that exceeds the task timeout yields TIMEOUT. A case after which the CUDA context no longer works
is charged with a CRASH and its worker retires.

A worker retires too after it ran an error input that could corrupt memory (its class is not
``memory_safe``) and the implementation did not cleanly refuse it: heap damage would otherwise
surface later, as a CRASH charged to a valid case whose bundle replays clean.
"""

from __future__ import annotations

import signal

from mlafuzz.harness.drive.tasks import AFTER_CALL, HARNESS_ERROR, Task, TaskResult
from mlafuzz.harness.drive.workers.phases import CONTRACT, LOADING
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.reports.findings import Finding, Kind

# The kinds by which a case says its implementation ran an error input instead of refusing it
# cleanly (accepted it, raised only after writing out of bounds, or raised only out of its kernel's
# launch: harness/check/contracts.py).
RAN_ERROR_INPUT = frozenset({Kind.ACCEPTED_INVALID_INPUT})


def memory_unsafe_run(task: Task, result: TaskResult, table: OpTable) -> bool:
    """Whether ``task``'s error input could have corrupted this process: its class is not
    memory-safe (the class's own fact, generators/ops/<op>.py ``INVALID``) and the implementation
    ran it (a finding of RAN_ERROR_INPUT for that class)."""
    if task.contract is None:
        return False
    klass = table.get(task.op).invalid_class(task.contract)
    return not klass.memory_safe and any(
        f.kind in RAN_ERROR_INPUT and f.extra.get("invalid_class") == task.contract for f in result.findings
    )


def cuda_broken(device: str) -> str | None:
    """None while this process's CUDA context still works, else the error it now raises.
    Synchronizing after every case also pins an asynchronous fault on the case that caused it."""
    import torch

    try:
        torch.cuda.synchronize(device)  # a sticky fault is returned by every later call, this one too
        return None
    except Exception as exc:  # torch.AcceleratorError / RuntimeError: the context is gone
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}"


def charge_broken_context(
    task: Task, result: TaskResult, error: str, table: OpTable, *, in_contract: bool = False
) -> TaskResult:
    """The case after which the CUDA context broke caused it: a CRASH for it (its other findings
    kept; dropped, what the broken context explains: harness errors, and the fault itself surfacing
    in the harness's next CUDA op, which alone would read as a LAUNCH_ERROR). ``in_contract``: the
    context still worked when the task's error input began (the worker synced there), so that
    input broke it: the CRASH names its class (cause ``contract:<class>:crash``, as a worker that
    dies in it), never the valid case, whose bundle would replay clean."""
    kept = tuple(f for f in result.findings if f.cause not in (HARNESS_ERROR, AFTER_CALL))
    cause, where, extra = "cuda_context", "", {}
    if in_contract and task.contract:
        cause, where = f"contract:{task.contract}:crash", f" in its error input {task.contract}"
        extra = {"part": "contract", "invalid_class": task.contract}
    crash = (
        task.resolve(table)
        .context()
        .finding(
            None,
            cause,
            kind=Kind.CRASH,
            message=f"the CUDA context broke{where or ' during this case'} ({error}); worker replaced",
            extra=extra,
        )
    )
    return TaskResult(
        findings=kept + (crash,),
        skipped=result.skipped,
        seconds=result.seconds,
        features=result.features,
        spec=result.spec,
    )


def death_message(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker died"
    if exitcode < 0:
        try:
            return f"worker killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with status {exitcode}"


def lost_finding(*, task: Task, part: int, kind: Kind, message: str, device: str, table: OpTable) -> Finding:
    """The finding of a task whose worker died (CRASH) or was killed for a hang (TIMEOUT) while in
    ``part`` of it: the error input's class is named, and the loading of an implementation is
    told apart from its case."""
    if part == CONTRACT and task.contract:
        cause = f"contract:{task.contract}:{kind.value.lower()}"
        message = f"{message} (in its error input {task.contract})"
    elif part == LOADING:
        cause = f"load:{kind.value.lower()}"
        message = f"{message} (loading the implementation, before the case)"
    else:
        cause = kind.value.lower()
    return (
        task.resolve(table)  # once: the finding's spec and case id come from it
        .context()
        .finding(
            None,
            cause,
            kind=kind,
            message=message,
            extra={
                "device": device,
                "part": "contract" if part == CONTRACT else "valid",
                **({"invalid_class": task.contract} if part == CONTRACT else {}),
            },
        )
    )
