"""Calling an implementation on a case: what it was given, what it returned, how it failed.

Two ways, one per path of the runner (harness/drive/run.py):

- ``call_copied`` (the full path): fresh copies of the case's inputs (or a
  previous call's, passed again), guarded outputs filled with a byte pattern,
  a device sync after the call so an asynchronous fault is the call's own;
- ``call_shared`` (the GPU fast path): views of the case's own inputs (the
  fast path fingerprints them instead of copying), outputs the caller has
  already allocated and filled, and no sync.

Either way, on CUDA the call is followed by a check for a CUDA error it left
pending (a launch it never checked, such as a zero-size grid): read before any
harness op can trip over it and blame itself, and charged to the call
(``Call.launch_error``). The check costs no device sync.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.memory import cuda_errors
from mlafuzz.harness.memory.guards import Guarded
from mlafuzz.harness.memory.redzone import RedZone
from mlafuzz.harness.ops.op import Op


@dataclass(frozen=True, kw_only=True)
class Call:
    """One call of the implementation: what it returned, what it was given, or how it failed."""

    outputs: Mapping[str, Any] | None
    inputs: Mapping[str, Any]
    guards: Mapping[str, Guarded]
    error: BaseException | None
    redzone: tuple = ()  # red-zone violations seen right after the call (GPU fast mode)
    launch_error: str | None = None  # a CUDA error the call left pending (LAUNCH_ERROR)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


HARNESS_DIR = Path(__file__).resolve().parents[1]  # frames in here are the harness's, not the implementation's
TRACEBACK_FRAMES = 12


def own_traceback(exc: BaseException) -> list[str]:
    """The traceback of an exception an implementation raised, shortened to its own frames: the
    harness's frames that led to the call are dropped, the last TRACEBACK_FRAMES kept."""
    frames = traceback.extract_tb(exc.__traceback__)
    while frames and Path(frames[0].filename).resolve().is_relative_to(HARNESS_DIR):
        frames.pop(0)
    lines = [ln.rstrip() for chunk in traceback.format_list(frames[-TRACEBACK_FRAMES:]) for ln in chunk.splitlines()]
    return lines + [first_line(exc)]


def raised_in_launch(exc: BaseException) -> str | None:
    """Where a kernel's launch raised ``exc``, or an exception it came from or met on the way
    (``__cause__``, ``__context__``): the launch's frame as "file:line", else None. A raise out of
    Triton's runtime (the launcher, the interpreter running the programs) is no refusal made before
    launching: the programs may have run, and written out of bounds, before it. vLLM's DCP filter,
    given ``length_mismatch`` under the interpreter, wrote past its own ``out`` and then raised out of
    the interpreter, whose own objects the stores had reached (InterpreterError: "missing 26
    required positional arguments")."""
    triton = sys.modules.get("triton")  # never imported: no frame of it can be in a traceback
    if triton is None or not getattr(triton, "__file__", None):
        return None
    runtime = Path(triton.__file__).resolve().parent / "runtime"
    # A compiled kernel that fails to compile on the input (a tl.static_assert, say) ran no program:
    # that refusal is made before anything was launched.
    compile_error = getattr(getattr(getattr(triton, "compiler", None), "errors", None), "CompilationError", None)
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if compile_error is not None and isinstance(e, compile_error):
            return None
        seen.add(id(e))
        for frame in traceback.extract_tb(e.__traceback__):
            if Path(frame.filename).resolve().is_relative_to(runtime):
                return f"triton/runtime/{Path(frame.filename).name}:{frame.lineno}"
        todo += [e.__cause__, e.__context__]
    return None


def _invoke(
    *,
    op: Op,
    fn: Callable,
    case: Case,
    inputs: Mapping[str, Any],
    guards: Mapping[str, Guarded],
    sub: Callable[[str], Callable],
    wait: bool,
    redzone: RedZone | None,
    invoke: Callable[..., Any] | None = None,
) -> Call:
    args = {**inputs, **{k: g.view for k, g in guards.items()}}
    if redzone is not None:
        redzone.check()  # start clean: only this call's writes count
    try:
        outputs = (invoke or op.invoke)(fn, case, args, sub)
        # Before anything of the harness's touches the device: what the call left pending is its own.
        pending = cuda_errors.take_pending(case.device)
        if pending is None and (wait or redzone is not None):
            sync(case.device)
        if op.derived is not None:  # the harness's own device ops, only now (see Op.derived)
            outputs = {**outputs, **op.derived(case, args)}
    except Exception as exc:  # a refusal or a failure: the caller decides which it is
        pending = cuda_errors.take_pending(case.device)
        return Call(
            outputs=None,
            inputs=inputs,
            guards=guards,
            error=exc,
            launch_error=pending,
            redzone=tuple(redzone.check()) if redzone is not None and pending is None else (),
        )
    return Call(
        outputs=outputs,
        inputs=inputs,
        guards=guards,
        error=None,
        launch_error=pending,
        redzone=tuple(redzone.check()) if redzone is not None and pending is None else (),
    )


def call_copied(
    *,
    op: Op,
    fn: Callable,
    case: Case,
    fill: int,
    sub: Callable[[str], Callable],
    reuse: Mapping[str, Any] | None = None,
    redzone: RedZone | None = None,
) -> Call:
    """One call on fresh copies of the case's inputs (``reuse``: inputs of an earlier call, passed
    again instead of copied; the op's in-place inputs are always fresh copies), its guarded
    outputs filled with ``fill``, synchronized after."""
    keep = {k: v for k, v in (reuse or {}).items() if k in case.tensors and k not in op.inplace}
    inputs = {**case.cloned_tensors(skip=keep.keys()), **keep}
    guards = op.guarded(case, fill) if op.guarded else {}
    return _invoke(op=op, fn=fn, case=case, inputs=inputs, guards=guards, sub=sub, wait=True, redzone=redzone)


def call_shared(
    *,
    op: Op,
    fn: Callable,
    case: Case,
    guards: Mapping[str, Guarded],
    sub: Callable[[str], Callable],
    wait: bool = False,
    redzone: RedZone | None = None,
    invoke: Callable[..., Any] | None = None,
) -> Call:
    """One call on views of the case's own tensors (the caller checks them by fingerprint; the
    in-place inputs are fresh copies) into ``guards`` the caller allocated and filled; no device
    sync unless ``wait`` (an asynchronous kernel error then surfaces at the caller's next sync;
    red-zone checks always sync). ``invoke``: called as the op row's ``invoke`` is, instead of it
    (a fast check's own way of making the call)."""
    # Views, not the tensors: the call can change their data (the fingerprints see it), not the
    # case's tensor objects.
    views = {k: v.view(v.shape) for k, v in case.tensors.items() if v is not None and k not in op.inplace}
    inputs = {**case.cloned_tensors(skip=views.keys()), **views}
    return _invoke(
        op=op, fn=fn, case=case, inputs=inputs, guards=guards, sub=sub, wait=wait, redzone=redzone, invoke=invoke
    )
