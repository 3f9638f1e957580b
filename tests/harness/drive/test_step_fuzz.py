"""Fuzzing the step op: our pipeline draws nothing; every planted step bug is caught, named, shrunk, replayed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.fuzz import case_seed
from mlafuzz.kernels.registry import default_registry
from mlafuzz.reports.findings import Severity
from mlafuzz.tests.support.helpers import draw_spec, materialize, resolve, run_case

MUTANTS = [e.name for e in default_registry().entries(op="step", mutants=True)]
MAX_CASES = 12  # each planted bug must show within this many drawn cases (run seed 0)


def _kinds_until(name: str, stop) -> tuple[int | None, set[str]]:
    entry = resolve("step", name)
    for i in range(MAX_CASES):
        seed = case_seed(0, "step", i)
        result = run_case(case=materialize(draw_spec("step", seed=seed), seed, "cpu"), entry=entry)
        kinds = {f.kind.value for f in result.findings if f.severity is Severity.ERROR}
        if stop(entry, kinds):
            return i, kinds
    return None, set()


def test_the_planted_step_bugs_are_registered_with_their_kinds():
    assert {n: resolve("step", n).expected_kind for n in MUTANTS} == {
        "step_full_req_id": "METADATA_MISMATCH",
        "step_no_seq_starts": "METADATA_MISMATCH",
        "step_second_split": "METADATA_MISMATCH",
        "step_ws_not_restarted": "METADATA_MISMATCH",
        "step_request_rows": "METADATA_MISMATCH",  # SPEC 9.5: ROCm ATOM #1831's look-alike
        "step_any_short_dense": "METADATA_MISMATCH",  # SPEC 9.5: vLLM #52512's look-alike
    }


@pytest.mark.parametrize("name", MUTANTS)
def test_every_planted_step_bug_draws_an_error_within_a_few_cases(name):
    index, kinds = _kinds_until(name, lambda entry, kinds: bool(kinds))
    assert index is not None, f"{name}: no finding in {MAX_CASES} cases"


@pytest.mark.parametrize("name", MUTANTS)
def test_every_planted_step_bug_draws_its_named_kind(name):
    index, kinds = _kinds_until(name, lambda entry, kinds: entry.expected_kind in kinds)
    assert index is not None, f"{name}: no {resolve('step', name).expected_kind} in {MAX_CASES} cases"


def test_fuzzing_our_step_pipeline_on_cpu_finds_nothing(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "step",
            "--impl",
            "step=ours",
            "--device",
            "cpu",
            "--cases",
            "20",
            "--in-process",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out + (tmp_path / "findings.jsonl").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["per_op"]["step"] >= 20 and summary["findings"] == 0


def test_the_full_req_id_bug_is_named_shrunk_and_replayed(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "step",
            "--impl",
            "step=step_full_req_id",
            "--device",
            "cpu",
            "--cases",
            "6",
            "--shrink-budget",
            "4",
            "--in-process",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 1
    found = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    assert found and all("req_id rows=" in f["message"] for f in found)
    assert {f["kind"] for f in found} == {"METADATA_MISMATCH"}
    bundle = next((tmp_path / "bundles").iterdir())
    case = json.loads((bundle / "case.json").read_text())
    assert len(case["spec"]["spec"]["requests"]) <= 3  # the smallest trigger is one decode and one prefill
    capsys.readouterr()
    assert main(["replay", str(bundle)]) == 1  # still broken
    assert main(["replay", str(bundle), "--impl", "step=ours"]) == 0  # the fix passes


def test_a_fresh_process_knows_the_step_op_from_the_op_table_alone():
    """No registration by import side effect: the table, the registry and the spec codec know the
    step op in a process that imported nothing else."""
    code = (
        "from mlafuzz.harness.ops.table import OPS; from mlafuzz.kernels.registry import default_registry;"
        "assert 'step' in OPS.names; r = default_registry(); assert r.get('step', 'ours');"
        "assert r.get('step', 'step_full_req_id');"
        "from mlafuzz.generators.spec import SCHEMA_VERSION;"
        "OPS.decode({'schema_version': SCHEMA_VERSION, 'op': 'step',"
        " 'spec': {'requests': [{'context_len': 3, 'query_len': 1}]}})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr
