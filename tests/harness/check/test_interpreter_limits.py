"""Environment failures are not the implementation's (issue 37 item 6): a call that fails on a
known limit of the installed Triton's CPU interpreter is a counted skip naming the Triton version,
never an EXCEPTION; an implementation's own exception still is one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
except ImportError:  # an optional extra: without it the tests that run Triton skip, the rest run
    triton = None

from mlafuzz.harness.check import interpreter  # noqa: E402
from mlafuzz.harness.check.interpreter import interpreter_limit  # noqa: E402
from mlafuzz.harness.cli.main import main  # noqa: E402

PLANTED = Path(__file__).parents[2] / "support" / "planted"
MASKED = f"{PLANTED / 'interpreter_mask_convert.py'}:convert"
RAISING = f"{PLANTED / 'raising_convert.py'}:convert"
NEW_INTERPRETER = triton is not None and tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 7)


def _fuzz(out: Path, impl: str, *revision: str) -> int:
    return main(
        ["fuzz", "--impl", f"convert={impl}", "--device", "cpu", "--cases", "24", "--seed", "3"]
        + ["--out", str(out), "--in-process", "--shrink-budget", "0", *revision]
    )


@pytest.mark.skipif(torch.cuda.is_available() or not NEW_INTERPRETER, reason="Triton >= 3.7's CPU interpreter")
def test_a_vllm_style_masked_load_under_the_interpreter_is_a_skip_naming_triton_not_an_exception(tmp_path, capsys):
    # The planted convert leaves a counted row in place (-1 where a slot is invalid), as vLLM did
    # before 0.30.0: judged under that revision, its decode cases are correct. Under the default
    # (2026-11: counted rows compacted) they would be VALUE_MISMATCHes, which this test is not about.
    assert _fuzz(tmp_path, MASKED, "--revision", "2026-10") == 0
    err = capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["by_kind"] == {}  # no EXCEPTION, and the decode cases it runs are correct
    assert summary["cases"] >= 4 and summary["skipped"] >= 4  # both kinds of case were met
    reason = f"Triton {triton.__version__}'s interpreter cannot run this kernel's masked loads"
    (line,) = [ln for ln in err.splitlines() if "skipped" in ln and "interpreter" in ln]  # printed once
    assert line.startswith(f"mlafuzz: skipped {summary['skipped']} cases: {reason}")
    assert "use Triton <= 3.6 on the CPU, or a GPU" in line


def test_an_implementations_own_exception_is_still_an_exception(tmp_path):
    assert _fuzz(tmp_path, RAISING) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["by_kind"].get("EXCEPTION", 0) >= 4 and not summary["skip_reasons"]


def _raised_from(inner: BaseException, outer_type: type = RuntimeError) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer_type(repr(exc)) from exc
    except outer_type as outer:
        return outer


def test_only_the_interpreters_own_error_on_a_triton_that_raises_it_is_the_environments(monkeypatch):
    InterpreterError = pytest.importorskip("triton.runtime.errors").InterpreterError  # noqa: N806

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(interpreter, "_triton_version", lambda: ("3.9.0", (3, 9)))
    limit = _raised_from(ValueError("mask has unsupported dtype"), InterpreterError)
    assert interpreter_limit(ValueError("mask has unsupported dtype")) is None  # not raised by the interpreter
    assert "Triton 3.9.0's interpreter" in interpreter_limit(limit)
    assert "Triton 3.9.0's interpreter" in interpreter_limit(_raised_from(limit))  # re-raised by a wrapper
    assert interpreter_limit(_raised_from(ValueError("index out of range"), InterpreterError)) is None
    assert interpreter_limit(None) is None
    monkeypatch.setattr(interpreter, "_triton_version", lambda: ("3.6.0", (3, 6)))
    assert interpreter_limit(limit) is None  # 3.6's interpreter runs it: something else failed
    monkeypatch.setattr(interpreter, "_triton_version", lambda: ("3.9.0", (3, 9)))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert interpreter_limit(limit) is None  # compiled Triton: the implementation's
