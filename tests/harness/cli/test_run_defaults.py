"""What a plain `mlafuzz fuzz` picks for the user: a fresh seed each run (printed, recorded, and kept
by --resume), the torch convert where Triton is missing (and the header says so), and one line, exit
2, for two implementations of one op."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from mlafuzz.harness.cli.main import main

GATHER = ["fuzz", "--op", "gather", "--impl", "gather=torch", "--device", "cpu", "--in-process"]


def _header_seed(err: str) -> int:
    match = re.search(r"seed (\d+) \(fresh: --seed \1 reruns these cases\)", err)
    assert match, err
    return int(match.group(1))


def test_two_plain_runs_draw_different_seeds_and_record_them(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLAFUZZ_SEED", raising=False)
    seeds = []
    for name in ("a", "b"):
        assert main([*GATHER, "--cases", "2", "--out", str(tmp_path / name)]) == 0
        seed = _header_seed(capsys.readouterr().err)
        assert json.loads((tmp_path / name / "run.json").read_text())["seed"] == seed
        seeds.append(seed)
    assert seeds[0] != seeds[1]


def test_resume_without_seed_goes_on_with_the_runs_recorded_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLAFUZZ_SEED", raising=False)
    out = tmp_path / "run"
    assert main([*GATHER, "--cases", "2", "--out", str(out)]) == 0
    seed = _header_seed(capsys.readouterr().err)
    assert main([*GATHER, "--cases", "2", "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"seed {seed}," in err and "resuming after 2 cases" in err
    assert json.loads((out / "summary.json").read_text())["cases"] == 4


def test_a_given_seed_is_the_runs_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLAFUZZ_SEED", raising=False)
    assert main([*GATHER, "--cases", "2", "--seed", "17", "--out", str(tmp_path / "a")]) == 0
    assert "seed 17," in capsys.readouterr().err
    assert json.loads((tmp_path / "a" / "run.json").read_text())["seed"] == 17


def test_two_impls_for_one_op_is_one_line_and_exit_2(tmp_path, capsys):
    rc = main([*GATHER, "--impl", "gather=torch_mutant_that_does_not_matter", "--cases", "2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "one implementation per op" in err
    assert not (tmp_path / "run.json").exists()


NO_TRITON = """
import sys
class NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTriton())
"""


def test_fuzz_without_triton_defaults_convert_to_torch_and_says_so(tmp_path):
    # sitecustomize on PYTHONPATH hides Triton in this process and in every worker it spawns.
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(NO_TRITON)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "hide")}
    env.pop("TRITON_INTERPRET", None)
    args = ["fuzz", "--op", "convert", "--device", "cpu", "--cases", "3", "--out", str(tmp_path / "out")]
    run = subprocess.run(
        [sys.executable, "-m", "mlafuzz.harness.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    header = run.stderr.splitlines()[0]
    assert "fuzzing convert=torch (convert=torch: triton not installed, so not convert=triton)" in header
    assert json.loads(Path(tmp_path / "out" / "run.json").read_text())["impls"] == {"convert": "torch"}
