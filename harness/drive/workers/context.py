"""How worker processes start: forked from a server that imported torch once.

A spawned worker imports torch afresh: ~2.5 s on a GPU host, in every worker at once at the start
of a run, and again in each replacement after a crash or a hang. That was most of the seconds
between ``mlafuzz fuzz`` and its first cases. On Linux the pool's workers come instead from
multiprocessing's forkserver: one server process imports ``PRELOAD`` once and forks each worker
from there. ``start_early`` starts that server as soon as a command knows it will need workers, so
its import runs beside the parent's own.

Never fork after CUDA is initialised: the server imports torch and nothing else (importing torch
makes no CUDA call). Triton stays out of it too, because Triton reads ``TRITON_INTERPRET`` when a
kernel module is imported, and the parent decides that variable after the server has started.
So a worker first takes on the parent's environment as it is when the worker is started
(``entry``), and only then imports the worker's own modules, Triton among them: the same
environment a spawned worker inherits.

Elsewhere (macOS, where forking after imports is unsafe; Windows) or with
``MLAFUZZ_WORKER_START=spawn``, workers are spawned as before.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
from typing import Any

PRELOAD = ["torch"]  # heavy to import, and no CUDA call or Triton import at import time
START_VARIABLE = "MLAFUZZ_WORKER_START"
START_METHODS = ("forkserver", "spawn")


class StartMethodError(ValueError):
    """``MLAFUZZ_WORKER_START`` names no start method; the message is one line."""


def start_method() -> str:
    """``forkserver`` on Linux unless ``MLAFUZZ_WORKER_START=spawn``; else ``spawn``."""
    asked = os.environ.get(START_VARIABLE, "")
    if asked and asked not in START_METHODS:
        raise StartMethodError(f"{START_VARIABLE}={asked!r}: use one of {', '.join(START_METHODS)}, or leave it unset")
    if asked == "spawn" or not sys.platform.startswith("linux"):
        return "spawn"
    return "forkserver"


def context() -> mp.context.BaseContext:
    """The multiprocessing context workers are started from (the forkserver's preload set)."""
    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_early() -> None:
    """Start the fork server now (a no-op when workers are spawned, or it runs already): its import
    of torch then overlaps the caller's own start-up instead of delaying the first worker."""
    if context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def environment() -> dict[str, str]:
    """What ``entry`` gives a worker: this process's environment now."""
    return dict(os.environ)


def entry(env: dict[str, str], target: str, *args: Any) -> None:
    """A worker's first code: take on ``env`` (the parent's, when it started this worker), then
    import ``target`` ("module:function") and call it with ``args``. This module imports nothing
    heavy and the target travels as a name, so nothing is imported before ``env`` is in place."""
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    os.environ.update(env)
    module, _, function = target.partition(":")
    getattr(importlib.import_module(module), function)(*args)
