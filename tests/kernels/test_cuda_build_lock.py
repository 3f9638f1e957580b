"""A killed, interrupted or concurrent CUDA-extension build never wedges or misleads a later run.

Field bug (H200, session 14): a run whose budget ended while the extension built in its
background thread left torch's ``lock`` file in the build folder, and every later process that
needed the extension waited on it forever. These tests run on any machine: torch's builder is
replaced by a fake that takes torch's own FileBaton in the folder it is given, as torch's
``_jit_compile`` does, and writes a fake .so there; the loader is a recorder.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils import cpp_extension
from torch.utils.file_baton import FileBaton

from mlafuzz.kernels import cuda_ext

ARCH = "sm_90"
JOIN_S = 30.0  # a build that does not end by then hangs: the test fails instead of CI


@dataclass(frozen=True)
class FakeToolchain:
    """``cpp_extension.load`` and ``torch.ops.load_library`` stand-ins that record their calls."""

    delay_s: float = 0.0
    fail: bool = False
    started: Path | None = None  # touched when a build starts
    builds: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)

    def load(self, *, name: str, build_directory: str, **_: Any) -> str:
        folder = Path(build_directory)
        so = folder / f"{name}.so"
        baton = FileBaton(str(folder / "lock"))  # torch's own exclusion, as _jit_compile takes it
        if not baton.try_acquire():
            baton.wait()
            return str(so)
        try:
            self.builds.append(build_directory)
            (folder / "fp8_ds_mla.cuda.o").write_bytes(b"half an object")
            if self.started is not None:
                self.started.touch()
            time.sleep(self.delay_s)
            if self.fail:
                raise RuntimeError("nvcc: interrupted")
            so.write_bytes(b"\x7fELF fake extension")
            return str(so)
        finally:
            baton.release()

    def install(self, setattr_: Callable[[Any, str, Any], None]) -> None:
        setattr_(cuda_ext, "_present_arch", lambda: ARCH)
        setattr_(cuda_ext, "_find_nvcc", lambda: "/fake/nvcc")
        setattr_(cpp_extension, "is_ninja_available", lambda: True)
        setattr_(cpp_extension, "load", self.load)
        setattr_(torch.ops, "load_library", self.loads.append)


def final_dir() -> Path:
    return cuda_ext._build_dir(name=cuda_ext.EXTENSION_NAME, sources=cuda_ext.SOURCES, include_dirs=(), arch=ARCH)


def build() -> cuda_ext.BuildInfo:
    # build_extension, not load_extension: that one is cached for the process
    return cuda_ext.build_extension(name=cuda_ext.EXTENSION_NAME, sources=cuda_ext.SOURCES)


def in_threads(n: int) -> list[cuda_ext.BuildInfo | BaseException]:
    """``build()`` in ``n`` daemon threads at once; fails (instead of hanging) if one never ends."""
    out: list[cuda_ext.BuildInfo | BaseException] = []

    def run() -> None:
        try:
            out.append(build())
        except BaseException as exc:
            out.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), f"a build still waits after {JOIN_S:.0f} s"
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MLAFUZZ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if ".tmp-" in p.name)


def test_a_build_whose_process_was_killed_does_not_stop_the_next_run_from_building(cache, tmp_path, monkeypatch):
    started = tmp_path / "started"
    script = textwrap.dedent(
        f"""
        import builtins
        from pathlib import Path
        from mlafuzz.tests.kernels.test_cuda_build_lock import FakeToolchain, build
        FakeToolchain(delay_s=600, started=Path({str(started)!r})).install(builtins.setattr)
        build()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert proc.poll() is None, f"the builder process died early: {proc.stderr.read() if proc.stderr else ''}"
            assert time.monotonic() < deadline, "the builder process never started its build"
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL: no finally of its own runs, as when a run's process is killed mid-build
        proc.wait()
    assert proc.returncode == -9
    tools = FakeToolchain()
    tools.install(monkeypatch.setattr)
    [info] = in_threads(1)
    assert isinstance(info, cuda_ext.BuildInfo), info
    assert info.cold and info.path == final_dir() / f"{cuda_ext.EXTENSION_NAME}.so" and info.path.exists()
    assert len(tools.builds) == 1 and tools.loads == [str(info.path)]
    assert leftovers(cache) == [] and not (final_dir() / "lock").exists()


def test_a_stale_torch_lock_file_left_in_the_build_folder_does_not_hang_the_next_build(cache, monkeypatch):
    stale = final_dir()
    stale.mkdir(parents=True)
    (stale / "lock").write_bytes(b"")  # what a killed torch build leaves
    (stale / "fp8_ds_mla.cuda.o").write_bytes(b"half an object")
    tools = FakeToolchain()
    tools.install(monkeypatch.setattr)
    [info] = in_threads(1)
    assert isinstance(info, cuda_ext.BuildInfo), info
    assert info.cold and info.path.read_bytes() == b"\x7fELF fake extension"
    assert sorted(p.name for p in stale.iterdir()) == ["fp8_ds_mla.cuda.o", f"{cuda_ext.EXTENSION_NAME}.so"]
    assert cuda_ext.extension_built()


def test_two_runs_asking_at_once_build_once_and_both_load_it(cache, monkeypatch):
    tools = FakeToolchain(delay_s=0.5)
    tools.install(monkeypatch.setattr)
    infos = in_threads(2)
    assert all(isinstance(i, cuda_ext.BuildInfo) for i in infos), infos
    assert len(tools.builds) == 1
    assert sorted(i.cold for i in infos) == [False, True]  # type: ignore[union-attr]
    so = str(final_dir() / f"{cuda_ext.EXTENSION_NAME}.so")
    assert tools.loads == [so, so]


def test_an_interrupted_build_leaves_no_build_folder_and_the_next_call_builds_again(cache, monkeypatch):
    tools = FakeToolchain(fail=True)
    tools.install(monkeypatch.setattr)
    with pytest.raises(RuntimeError, match="interrupted"):
        build()
    assert not final_dir().exists() and not cuda_ext.extension_built()
    assert leftovers(cache) == [] and tools.loads == []
    again = FakeToolchain()
    again.install(monkeypatch.setattr)
    info = build()
    assert info.cold and len(again.builds) == 1 and again.loads == [str(info.path)]
    assert cuda_ext.extension_built() and leftovers(cache) == []


def test_a_built_extension_loads_without_nvcc_or_ninja(cache, monkeypatch):
    tools = FakeToolchain()
    tools.install(monkeypatch.setattr)
    first = build()
    monkeypatch.setattr(cuda_ext, "_find_nvcc", lambda: None)
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    second = build()
    assert first.cold and not second.cold and second.path == first.path
    assert len(tools.builds) == 1 and tools.loads == [str(first.path)] * 2


def test_a_run_waiting_on_another_process_build_says_which_process(cache, monkeypatch, caplog):
    monkeypatch.setattr(cuda_ext, "_WAIT_WARN_S", 0.2)
    tools = FakeToolchain(delay_s=1.0)
    tools.install(monkeypatch.setattr)
    folder = final_dir()
    holder = threading.Thread(target=build, daemon=True)
    with caplog.at_level(logging.WARNING, logger=cuda_ext.__name__):
        holder.start()
        deadline = time.monotonic() + JOIN_S
        while not tools.builds:  # the holder has the lock and builds
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with cuda_ext._build_lock(folder):  # waits as another process's build would
            pass
        holder.join(JOIN_S)
    assert not holder.is_alive() and len(tools.builds) == 1
    [record] = [r for r in caplog.records if "waiting" in r.getMessage()]
    assert f"process {os.getpid()}'s build of {folder.name}" in record.getMessage()


CPU_OP = """
#include <torch/library.h>
#include <ATen/ATen.h>
double factor();  // helper.cpp: the extension's second translation unit, as kernels.cu is
static at::Tensor twice(const at::Tensor& x) { return x * factor(); }
TORCH_LIBRARY(mlafuzz_build_lock_test, m) { m.def("twice(Tensor x) -> Tensor", &twice); }
"""
HELPER = "double factor() { return 2.0; }\n"


@pytest.mark.slow
def test_a_real_torch_build_is_moved_into_place_and_loads_once(cache, tmp_path, monkeypatch):
    """torch's real builder and loader on a CPU op of two translation units (g++ and ninja, no
    nvcc): the build made in the temp folder links both, is renamed into place, and loading the
    final .so registers nothing twice."""
    if not cpp_extension.is_ninja_available() or shutil.which("c++") is None:
        pytest.skip("needs ninja and a C++ compiler")
    source = tmp_path / "src" / "op.cpp"
    source.parent.mkdir()
    source.write_text(CPU_OP)
    (source.parent / "helper.cpp").write_text(HELPER)
    sources = (source, source.parent / "helper.cpp")
    monkeypatch.setattr(cuda_ext, "_present_arch", lambda: ARCH)
    monkeypatch.setattr(cuda_ext, "_find_nvcc", lambda: "/fake/nvcc")
    info = cuda_ext.build_extension(name="mlafuzz_build_lock_test", sources=sources)
    assert info.cold and info.path.exists() and info.path.parent.name.startswith("mlafuzz_build_lock_test-")
    assert leftovers(cache) == [] and not (info.path.parent / "lock").exists()
    again = cuda_ext.build_extension(name="mlafuzz_build_lock_test", sources=sources)
    assert not again.cold and again.path == info.path
    assert torch.ops.mlafuzz_build_lock_test.twice(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
