"""Workers forked from the server that imported torch see what spawned workers saw: the parent's
environment as it is when the worker starts (not when the server started), with nothing of Triton
imported before that environment is in place."""

from __future__ import annotations

import os
import sys

import pytest

from mlafuzz.harness.drive.workers import context


def _report(conn) -> None:  # the worker's target: what it sees at its start
    conn.send((dict(os.environ), "triton" in sys.modules, os.getppid()))
    conn.close()


def _start(ctx):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=context.entry, args=(context.environment(), f"{__name__}:_report", child), daemon=True)
    proc.start()
    child.close()
    assert parent.poll(120), "the worker never reported"
    seen = parent.recv()
    proc.join(timeout=30)
    return seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux-only here")
def test_a_forked_worker_sees_a_variable_set_after_the_server_started_and_no_triton(monkeypatch):
    monkeypatch.delenv(context.START_VARIABLE, raising=False)
    ctx = context.context()
    assert ctx.get_start_method() == "forkserver"
    context.start_early()
    monkeypatch.setenv("MLAFUZZ_TEST_LATE", "set after the server started")
    monkeypatch.delenv("MLAFUZZ_TEST_GONE", raising=False)
    env, triton_loaded, ppid = _start(ctx)
    assert env["MLAFUZZ_TEST_LATE"] == "set after the server started"
    assert "MLAFUZZ_TEST_GONE" not in env
    assert not triton_loaded  # TRITON_INTERPRET is read when Triton kernels are imported: not before env
    assert ppid != os.getpid()  # forked by the server, not by this process


def test_mlafuzz_worker_start_spawn_spawns_and_a_bad_value_is_one_line(monkeypatch):
    monkeypatch.setenv(context.START_VARIABLE, "spawn")
    ctx = context.context()
    assert ctx.get_start_method() == "spawn"
    env, _, ppid = _start(ctx)
    assert ppid == os.getpid() and env[context.START_VARIABLE] == "spawn"
    monkeypatch.setenv(context.START_VARIABLE, "threads")
    with pytest.raises(context.StartMethodError, match="MLAFUZZ_WORKER_START='threads'"):
        context.start_method()
