"""What `pip install .` ships: the import name, the CUDA and allocator sources, nothing generic at the top."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "oracles", "generators", "kernels", "reports", "tests")


def test_wheel_ships_every_source_file_the_gpu_paths_build_and_nothing_generic(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = tmp_path.glob("mlafuzz-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "mlafuzz/kernels/csrc/kernels.cu",
        "mlafuzz/kernels/csrc/ops.cpp",
        "mlafuzz/kernels/csrc/params.h",
        "mlafuzz/kernels/csrc/gather_device.cuh",
        "mlafuzz/harness/memory/csrc/redzone_alloc.cpp",
        "mlafuzz/harness/cli/main.py",
        "mlafuzz/oracles/codec.py",
        "mlafuzz/generators/spec.py",
        "mlafuzz/reports/jsonl.py",
        "mlafuzz/tests/conftest.py",
    ):
        assert needed in names, needed
    # Every module of the tree, in every subfolder: a folder missing from pyproject's package list
    # installs nothing, and `pip install .` (the GPU image's way) then fails at its first import.
    # The same for the C++/CUDA sources that the GPU paths and the planted kernels build at run time.
    tree = {
        f"mlafuzz/{p.relative_to(ROOT).as_posix()}"
        for folder in FOLDERS
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and (p.suffix == ".py" or "csrc" in p.parts) and "__pycache__" not in p.parts
    }
    assert sorted(tree - names) == []
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"mlafuzz"}, top  # no top-level `kernels`, `harness`, ...
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "mlafuzz = mlafuzz.harness.cli.main:main" in text and "pytest11" in text
