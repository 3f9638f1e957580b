"""What a run builds before its cases can run, started early; and the caches that keep it.

``start_builds``: on a GPU whose CUDA extension is not built yet, its build in a background
thread of the parent, said in a line when it starts and when it is done, for ``mlafuzz fuzz``
and ``mlafuzz warmup`` alike. ``cache_folders``: the on-disk caches a run fills (Triton's,
mlafuzz's, torch's JIT extensions'), which a CI job keeps between runs.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping


def cache_folders(environ: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(variable, folder, what it holds) for each cache a run fills, as the variable (or the
    tool's default when unset) says; nothing is imported or created."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    triton_home = Path(env.get("TRITON_HOME") or home)
    triton = env.get("TRITON_CACHE_DIR") or str(triton_home / ".triton" / "cache")
    mlafuzz = env.get("MLAFUZZ_CACHE") or str(home / ".cache" / "mlafuzz")
    xdg = Path(env.get("XDG_CACHE_HOME") or home / ".cache")  # torch's appdirs default
    torch_ext = env.get("TORCH_EXTENSIONS_DIR") or str(xdg / "torch_extensions")
    return [
        ("TRITON_CACHE_DIR", triton, "Triton's compiled kernels: fused generation, fast-path checks, Triton impls"),
        ("MLAFUZZ_CACHE", mlafuzz, "mlafuzz's CUDA extension builds (and its small host helpers)"),
        ("TORCH_EXTENSIONS_DIR", torch_ext, "torch's JIT extensions: an --impl that builds itself with cpp_extension"),
    ]


def needs_extension(impls: Mapping[str, str]) -> bool:
    """Whether a run of these implementations calls our CUDA extension: our gather or writer, or
    the step pipeline (its gather is ours unless MLAFUZZ_SUB_* says otherwise)."""
    return any(ref == "cuda" for ref in impls.values()) or impls.get("step") == "ours"


def start_builds(
    *, device: str, impls: Mapping[str, str], say: Callable[[str], None]
) -> tuple[threading.Thread, dict[str, Any]] | None:
    """On a GPU whose CUDA extension is not built yet and a run that needs it: its build in a
    background thread, with a line now and one when it is done (``say``); a line too when Triton's
    cache is empty (its compiles happen in the workers, as cases meet them). Returns (thread,
    outcome: 'info' or 'error') or None when there is nothing to build."""
    if device.split(":")[0] != "cuda":
        return None
    triton = Path(cache_folders()[0][1])
    if not (triton.is_dir() and any(triton.iterdir())):
        say(
            f"Triton's cache {triton} is empty: each kernel variant compiles when a case first needs it"
            " (about 1 s each, in every worker at once); `mlafuzz warmup` compiles them ahead"
        )
    if not needs_extension(impls):
        return None
    from mlafuzz.kernels import cuda_ext

    if cuda_ext.extension_built():
        return None
    outcome: dict[str, Any] = {}
    start = time.monotonic()
    say(
        f"building the CUDA extension {cuda_ext.EXTENSION_NAME} in the background (first run here;"
        " ops that need it wait for it, the others start now; `mlafuzz warmup` builds it ahead)"
    )

    def done(info: Any, error: BaseException | None) -> None:
        outcome.update(info=info, error=error, seconds=time.monotonic() - start)
        if error is not None:
            say(f"the CUDA extension did not build: {type(error).__name__}: {first_line(error)}")
        else:
            say(f"built the CUDA extension in {outcome['seconds']:.1f} s ({info.arch}, {info.path.parent})")

    return cuda_ext.build_in_background(done), outcome


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def built_or_not_needed(thread: threading.Thread, impls: Mapping[str, str]) -> Callable[[str], bool]:
    """The fuzz loop's ``ready(op)`` while ``thread`` builds the extension: an op whose
    implementation needs it waits (its cases go later, in order), the others start now."""

    def ready(op: str) -> bool:
        return not thread.is_alive() or not needs_extension({op: impls.get(op, "")})

    return ready
