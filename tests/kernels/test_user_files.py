"""A ``path.py:attr`` implementation loads as ``python path.py`` would run it: its sibling modules
import, and two users' files (or two siblings) of one name never stand in for each other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mlafuzz.kernels.external import external_entry

BIN = Path(sys.executable).parent


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def _impl_with_sibling(folder: Path, *, tag: str) -> Path:
    """``gather.py`` importing its sibling ``helpers.py`` (the same names in every folder), which
    answers ``tag``, once at import and once lazily inside the call."""
    _write(folder, "helpers.py", f"TAG = {tag!r}\n")
    return _write(
        folder,
        "gather.py",
        "from helpers import TAG\n\n"
        "def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):\n"
        "    import helpers\n"
        "    return TAG, helpers.TAG\n",
    )


def _call(entry):
    return entry.loader("cpu")(None, None, None, None, 0, None)


def test_a_users_file_imports_its_sibling_module(tmp_path):
    path = _impl_with_sibling(tmp_path / "my impls", tag="mine")
    entry = external_entry("gather", f"{path}:gather", rejects=())
    assert _call(entry)[0] == "mine"


def test_two_users_files_of_one_name_each_get_their_own_module_and_siblings(tmp_path):
    first = external_entry("gather", f"{_impl_with_sibling(tmp_path / 'a', tag='a')}:gather", rejects=())
    second = external_entry("gather", f"{_impl_with_sibling(tmp_path / 'b', tag='b')}:gather", rejects=())
    assert _call(first)[0] == "a"
    assert _call(second)[0] == "b"


def test_a_sibling_named_like_a_module_mlafuzz_imports_later_does_not_shadow_it(tmp_path):
    _write(tmp_path / "u", "fractions.py", "raise RuntimeError('the user sibling shadowed the stdlib')\n")
    path = _write(tmp_path / "u", "gather.py", "def gather(*args, **kwargs):\n    return 'ok'\n")
    external_entry("gather", f"{path}:gather", rejects=())
    sys.modules.pop("fractions", None)
    import fractions  # what any later import of mlafuzz's (or torch's) gets

    assert fractions.Fraction(1, 2) == 0.5


def test_a_fuzz_run_of_a_users_file_with_a_sibling_import_runs_in_its_workers(tmp_path):
    folder = tmp_path / "my impls"
    _write(folder, "gather_ok_mod.py", "from mlafuzz.kernels.torch_impl import gather_torch as ok\n")
    _write(
        folder,
        "gather_old.py",
        "from gather_ok_mod import ok\n\n"
        "def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):\n"
        "    ok(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)\n",
    )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run(
        ["mlafuzz", "fuzz", "--op", "gather", "--impl", "gather=gather_old.py:gather", "--device", "cpu"]
        + ["--cases", "4", "--seed", "0", "--out", str(tmp_path / "out"), "--workers", "1"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
