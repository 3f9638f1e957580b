"""Installs and runs where its users are: no triton needed for the torch paths, the Triton
interpreter decided once at the entry point, a contradicting environment a usage error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlafuzz.harness.cli.main import main

_NO_TRITON = """
import importlib.abc, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoTriton())
from mlafuzz.harness.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _run(argv: list[str], *, code: str = _NO_TRITON, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300, env={**clean, **(env or {})}
    )


def test_help_answers_without_importing_torch_or_triton():
    code = (
        "import sys\nfrom mlafuzz.harness.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    proc = _run([], code=code)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "False False", proc.stdout + proc.stderr


def test_without_triton_the_torch_paths_fuzz_and_asking_for_triton_is_one_line(tmp_path):
    ok = _run(
        ["fuzz", "--impl", "gather=torch", "--device", "cpu", "--cases", "12", "--quiet", "--out", str(tmp_path / "a")]
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    every = _run(["fuzz", "--device", "cpu", "--cases", "8", "--quiet", "--out", str(tmp_path / "b")])
    assert every.returncode == 0 and "convert" in every.stdout, every.stdout + every.stderr  # the torch convert
    asked = _run(["fuzz", "--impl", "convert=triton", "--device", "cpu", "--cases", "2", "--out", str(tmp_path / "c")])
    assert asked.returncode == 2 and len(asked.stderr.strip().splitlines()) == 1
    assert "needs triton" in asked.stderr and "Traceback" not in asked.stderr
    listed = _run(["list"])
    assert listed.returncode == 0 and "needs triton" in listed.stdout


def test_interpret_off_on_a_cpu_run_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert main(["fuzz", "--device", "cpu", "--cases", "1", "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "TRITON_INTERPRET=0" in err


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
def test_the_cli_sets_the_interpreter_itself_when_the_shell_does_not(tmp_path):
    """The README's CPU mutants command, with TRITON_INTERPRET unset: our Triton convert runs
    under the interpreter and the correct implementation draws nothing (it used to draw
    EXCEPTION findings because triton was imported before the CLI set the variable)."""
    code = "import sys\nfrom mlafuzz.harness.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    proc = _run(
        [
            "fuzz",
            "--op",
            "convert",
            "--impl",
            "convert=triton",
            "--device",
            "cpu",
            "--cases",
            "6",
            "--in-process",
            "--quiet",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
        ],
        code=code,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
