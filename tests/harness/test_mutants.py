"""The harness proves its power: every planted bug in the CPU catalog is killed with its one expected
kind (one cause, one bucket), and the correct impls stay clean."""

from __future__ import annotations

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.mutants import run_mutants
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.registry import default_registry

CASES_PER_MUTANT = 40


def test_catalog_has_at_least_20_described_mutants_across_all_ops():
    mutants = default_registry().entries(mutants=True)
    assert len(mutants) >= 20
    assert {m.op for m in mutants} == {"convert", "gather", "writer", "step"}
    assert all(m.description and m.expected_kind for m in mutants)


def test_every_cpu_mutant_is_killed_drawing_only_its_kind_and_correct_implementations_draw_nothing(tmp_path):
    session = Session(table=OPS)
    results, clean = run_mutants(session=session, ops=list(OPS.names), device="cpu", budget=None,
                                 cases=CASES_PER_MUTANT, out=tmp_path, seed=0, shrink_budget=0.0,
                                 executor=InProcess(session=session))
    assert len(results) >= 20
    assert [r.name for r in results if not r.killed] == []
    assert {r.name: r.found for r in results if r.found != (r.expected,)} == {}
    assert clean == []


def test_the_mutants_command_prints_its_score_and_exits_0(tmp_path, capsys):
    rc = main(["mutants", "--device", "cpu", "--op", "writer", "--cases-per-mutant", str(CASES_PER_MUTANT),
               "--shrink-budget", "0", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "SURVIVED" not in out and "(100%)" in out and "no findings" in out, out
    assert rc == 0
