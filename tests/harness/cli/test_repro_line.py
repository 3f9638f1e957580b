"""The repro line a run prints is the line that runs: copied into a shell as printed, from the
folder the run was started in, it replays the finding (exit 1), for a user's own kernel in a folder
whose name has a space."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mlafuzz.reports.invocation import command

PLANTED = Path(__file__).parents[2] / "support" / "planted"
BIN = Path(sys.executable).parent  # the venv's console scripts: `mlafuzz` as a user types it


def _shell(command: str, *, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_printed_repro_for_a_users_kernel_in_a_folder_with_a_space_runs_as_printed(tmp_path):
    (tmp_path / "my impls").mkdir()
    shutil.copy(PLANTED / "gather_from_zero.py", tmp_path / "my impls" / "bug_gather.py")
    run = _shell(
        "mlafuzz fuzz --op gather --impl 'gather=my impls/bug_gather.py:gather' --device cpu --cases 40"
        " --seed 0 --out out --shrink-budget 3 --in-process",
        cwd=tmp_path,
    )
    assert run.returncode == 1, run.stderr
    printed = [line.split(": ", 1)[1] for line in run.stdout.splitlines() if line.strip().startswith("repro (")]
    assert len(printed) == 1, run.stdout
    line = printed[0]
    assert "--impl 'gather=my impls/bug_gather.py:gather'" in line

    replayed = _shell(line, cwd=tmp_path)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "reproduces" in replayed.stdout

    # The same line everywhere a user may copy it from.
    (bundle,) = (tmp_path / "out" / "bundles").iterdir()
    assert (bundle / "replay.txt").read_text().strip() == line
    assert json.loads((bundle / "finding.json").read_text())["repro"] == line
    for fmt in ("md", "junit"):
        report = _shell(f"mlafuzz report out --format {fmt}", cwd=tmp_path)
        assert line in report.stdout, fmt
    html = _shell("mlafuzz report out --format html", cwd=tmp_path).stdout
    assert line.replace("'", "&#x27;") in html


def test_a_builtin_implementations_repro_needs_no_impl_flag():
    from mlafuzz.reports.bundle import replay_command

    assert replay_command(Path("out/bundles/B"), op="gather", impl="torch") == command("replay", "out/bundles/B")
    assert replay_command(Path("o/b x"), op="gather", impl="pkg.mod:gather") == (
        command("replay", "o/b x", "--impl", "gather=pkg.mod:gather")
    )
