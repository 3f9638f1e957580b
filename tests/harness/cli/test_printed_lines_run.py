"""Every command line a run prints names the executable the user ran, so pasted into a shell from
the run's folder it runs: started as ``.venv/bin/mlafuzz`` (not on PATH), the repro lines, each
bundle's replay.txt and the reports' replay lines start with ``.venv/bin/mlafuzz``; started as
``python -m mlafuzz.harness.cli``, with that interpreter's ``-m`` line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLANTED = Path(__file__).parents[2] / "support" / "planted" / "gather_from_zero.py"
VENV = Path(sys.executable).parent.parent
BIN = str(Path(sys.executable).parent)


def _shell(command: str, *, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` in bash, from ``cwd``, with a PATH that does not hold the venv (as a user's
    shell that never activated it)."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != BIN)
    env = {**os.environ, "PATH": path or "/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _commands(text: str, prefix: str) -> list[str]:
    """The command lines in ``text``: from ``prefix`` to the line's end (a hint's closing
    parenthesis or backtick left out)."""
    found = []
    for line in text.splitlines():
        at = line.find(prefix)
        if at < 0:
            continue
        cmd = line[at:]
        opener = line[at - 1] if at else ""
        if opener and opener in "(`":
            cmd = cmd[: cmd.index(")" if opener == "(" else "`")]
        found.append(cmd)
    return found


@pytest.mark.parametrize(
    "prefix",
    [".venv/bin/mlafuzz", ".venv/bin/python -m mlafuzz.harness.cli"],
    ids=["console-script", "python-m"],
)
def test_every_printed_command_line_of_a_run_with_findings_runs_as_printed(tmp_path, prefix):
    (tmp_path / ".venv").symlink_to(VENV)  # the README's layout: a venv in the folder the user works in
    shutil.copy(PLANTED, tmp_path / "bug.py")
    run = _shell(
        f"{prefix} fuzz --op gather --impl gather=bug.py:gather --device cpu --cases 12 --seed 0"
        " --out out --shrink-budget 1 --in-process",
        cwd=tmp_path,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    lines = _commands(run.stdout + "\n" + run.stderr, prefix)
    lines += [(b / "replay.txt").read_text().strip() for b in (tmp_path / "out" / "bundles").iterdir()]
    for fmt in ("md",):
        report = _shell(f"{prefix} report out --format {fmt}", cwd=tmp_path)
        assert report.returncode in (0, 1), report.stderr
        lines += _commands(report.stdout, prefix)
    replays = [line for line in lines if " replay " in line]
    assert replays and all(line.startswith(prefix + " ") for line in lines), lines
    for line in dict.fromkeys(lines):
        pasted = _shell(line, cwd=tmp_path)
        assert pasted.returncode in (0, 1), f"{line}: exit {pasted.returncode}: {pasted.stderr}"
        if " replay " in line:
            assert "reproduces" in pasted.stdout, line


def test_a_process_that_is_not_the_cli_names_the_console_script_beside_its_python(tmp_path):
    """The pytest plugin's user ran pytest: its lines name the venv's mlafuzz, which runs."""
    printed = subprocess.run(
        [sys.executable, "-c", "from mlafuzz.reports.invocation import command; print(command('list'))"],
        cwd=tmp_path,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed == f"{Path(sys.executable).parent / 'mlafuzz'} list"
    assert _shell(printed, cwd=tmp_path).returncode == 0
