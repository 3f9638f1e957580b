"""A worker that dies before it is ready says why, in the one-line error the run exits 2 with,
and the red-zone allocator builds once however many workers start on a cold cache."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import sys

import pytest

from mlafuzz.harness.drive.workers import WorkerPool, WorkerStartError

# Imports fine in the run's own process; breaks in its worker processes only, as a module that
# touches the GPU or a shared build at import can (the red-zone start failure was an OSError).
BREAKS_IN_WORKERS = {
    "oserror": (
        "import multiprocessing\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    raise OSError('libcuda.so: cannot open shared object file')\n",
        "OSError: libcuda.so: cannot open shared object file",
    ),
    "hard_exit": (
        "import multiprocessing, os, sys\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    sys.stderr.write('fatal: the driver refused this process\\n')\n"
        "    sys.stderr.flush()\n"
        "    os._exit(0)\n",
        "fatal: the driver refused this process",
    ),
}


@pytest.mark.parametrize("how", sorted(BREAKS_IN_WORKERS))
def test_a_worker_that_dies_before_it_is_ready_names_the_cause(how, tmp_path, monkeypatch):
    source, cause = BREAKS_IN_WORKERS[how]
    name = f"mlafuzz_test_breaks_{how}"
    (tmp_path / f"{name}.py").write_text(source + "from mlafuzz.harness.ops.table import OPS\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers inherit sys.path
    pool = WorkerPool(devices=["cpu"], timeout=600.0, table_ref=f"{name}:OPS")
    try:
        with pytest.raises(WorkerStartError) as caught:
            for _ in range(10_000):  # each wait returns after at most 0.2 s; three starts fail long before
                pool.wait(0.2)
    finally:
        pool.close()
        sys.modules.pop(name, None)
    message = str(caught.value)
    assert "\n" not in message and cause in message, message
    assert "status 0, 3 times" not in message  # the old "printed above" that printed nothing


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="builds the red-zone allocator with nvcc")
def test_the_redzone_allocator_builds_on_a_cold_cache_in_three_processes_at_once(tmp_path, monkeypatch):
    # The cause of `--redzone --workers 8` dying at start: every worker built the allocator into
    # one shared temporary file; all but one then failed to rename or load it (an OSError).
    monkeypatch.setenv("MLAFUZZ_CACHE", str(tmp_path / "cache"))
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        paths = pool.map(_build, range(3))
    assert len(set(paths)) == 1 and all(_loads(p) for p in paths)


def _build(_: int) -> str:
    from mlafuzz.harness.memory.redzone import build

    return str(build())


def _loads(path: str) -> bool:
    import ctypes

    return ctypes.CDLL(path).mlafuzz_rz_check_all is not None
