"""`mlafuzz mutants` sums each catalog family (a mutant's ``group``) into one recall line."""

from __future__ import annotations

from mlafuzz.harness.cli.main import main
from mlafuzz.kernels.registry import default_registry


def test_each_group_of_the_dcp_catalog_gets_one_recall_line_and_every_member_is_killed(tmp_path, capsys):
    rc = main(
        ["mutants", "--device", "cpu", "--op", "dcp", "--op", "dcp_peer", "--cases-per-mutant", "40"]
        + ["--shrink-budget", "0", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    members = [e for e in default_registry().entries(mutants=True) if e.op in ("dcp", "dcp_peer")]
    for group in sorted({e.group for e in members if e.group}):
        n = sum(e.group == group for e in members)
        assert f"group {group}: {n}/{n} killed (100% recall)" in out, out
    assert rc == 0


def test_every_look_alike_of_a_reported_bug_cites_its_report():
    reports = [e for e in default_registry().entries(mutants=True) if e.group == "vllm-reports"]
    assert len(reports) >= 4
    assert all("#" in e.description for e in reports)
