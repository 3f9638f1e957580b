"""Optional surfaces are visible (issue 37 item 5): the header says what each implementation is
given and why not; a ``**kwargs`` wrapper is told what it will never be drawn, and ``--features``
declares it, through the run, its resume, its bundles, replay and repro lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.reports.findings import Finding
from mlafuzz.reports.model import replay_command as rerun_line

PLANTED = Path(__file__).parents[2] / "support" / "planted"
WRAPPER = f"{PLANTED / 'kwargs_convert.py'}:convert"
IGNORES_OUT = f"{PLANTED / 'kwargs_convert.py'}:convert_ignores_out"
OLD = f"{PLANTED / 'old_convert.py'}:convert"

pytest_plugins = ["pytester"]


def _fuzz(out: Path, impl: str, *extra: str, cases: int = 24) -> int:
    return main(
        ["fuzz", "--impl", f"convert={impl}", "--device", "cpu", "--cases", str(cases), "--seed", "3"]
        + ["--out", str(out), "--in-process", "--shrink-budget", "0", *extra]
    )


def _surface_lines(err: str, impl: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"mlafuzz: convert={impl}:")]


def test_a_kwargs_wrapper_is_told_in_one_line_what_it_will_never_be_drawn_and_how_to_declare_it(tmp_path, capsys):
    assert _fuzz(tmp_path / "run", WRAPPER, cases=2) == 0
    lines = _surface_lines(capsys.readouterr().err, WRAPPER)
    assert len(lines) == 1, lines
    assert "will never be drawn block_stride_rows, compact_to_front, caller_out" in lines[0]
    assert "--features convert=block_stride_rows,compact_to_front,caller_out" in lines[0]


def test_the_header_names_what_a_readable_signature_is_not_given_and_why(tmp_path, capsys):
    assert _fuzz(tmp_path / "old", OLD, cases=2) == 0
    assert _fuzz(tmp_path / "ours", "torch", cases=2) == 0
    err = capsys.readouterr().err
    assert _surface_lines(err, OLD) == [
        f"mlafuzz: convert={OLD}: given none; not given: block_stride_rows, compact_to_front, caller_out,"
        " idx_mapping, dcp_args (not in its signature)"
    ]
    assert _surface_lines(err, "torch") == [
        "mlafuzz: convert=torch: given block_stride_rows, compact_to_front, caller_out, idx_mapping, dcp_args"
    ]


def test_a_declared_surface_is_drawn_for_the_wrapper_and_recorded_in_run_json(tmp_path, capsys):
    assert _fuzz(tmp_path / "plain", WRAPPER) == 0
    assert _fuzz(tmp_path / "declared", WRAPPER, "--features", "convert=caller_out") == 0
    err = capsys.readouterr().err
    assert "given caller_out (declared)" in err

    def caller_out_cases(run: str) -> int:
        return json.loads((tmp_path / run / "summary.json").read_text())["coverage"].get("caller-out", 0)

    assert caller_out_cases("plain") == 0
    assert caller_out_cases("declared") >= 4
    assert json.loads((tmp_path / "declared" / "run.json").read_text())["features"] == {"convert": ["caller_out"]}


def test_a_bad_features_name_is_one_line_listing_the_valid_names_and_exit_2(tmp_path, capsys):
    assert _fuzz(tmp_path / "run", WRAPPER, "--features", "convert=caller_out,outs") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no optional surface 'outs'" in err[0]
    assert "valid: block_stride_rows, compact_to_front, caller_out" in err[0]
    assert not (tmp_path / "run" / "run.json").exists()


def test_declaring_a_surface_a_readable_signature_cannot_take_is_exit_2(tmp_path, capsys):
    assert _fuzz(tmp_path / "run", OLD, "--features", "convert=caller_out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot take caller_out" in err[0]


def test_features_for_an_op_the_run_does_not_fuzz_is_exit_2(tmp_path, capsys):
    assert _fuzz(tmp_path / "run", WRAPPER, "--features", "gather=host_tier") == 2
    assert "op 'gather' is not fuzzed in this run" in capsys.readouterr().err


def test_a_resume_must_declare_the_same_features(tmp_path, capsys):
    out = tmp_path / "run"
    assert _fuzz(out, WRAPPER, "--features", "convert=caller_out", cases=2) == 0
    assert _fuzz(out, WRAPPER, "--resume", cases=2) == 2
    assert "its features is {'convert': ['caller_out']}" in capsys.readouterr().err
    assert _fuzz(out, WRAPPER, "--resume", "--features", "convert=caller_out", cases=2) == 0


def test_a_bug_behind_a_declared_surface_is_bundled_and_replayed_with_that_surface(tmp_path, capsys):
    out = tmp_path / "run"
    assert _fuzz(out, IGNORES_OUT) == 0  # undeclared: never given caller-owned outputs, so never wrong
    assert _fuzz(out, IGNORES_OUT, "--overwrite", "--features", "convert=caller_out") == 1
    bundle = next((out / "bundles").iterdir())
    assert json.loads((bundle / "case.json").read_text())["features"] == ["caller_out"]
    capsys.readouterr()
    replay = (bundle / "replay.txt").read_text().split()
    assert main([*replay[1:]]) == 1  # the printed line, as printed: it reproduces
    assert "reproduces" in capsys.readouterr().out


def test_a_rerun_line_declares_the_runs_features():
    finding = Finding.from_json(
        {"kind": "VALUE_MISMATCH", "op": "convert", "impl": WRAPPER, "case_id": "c", "message": "m", "cause": "x"}
    )
    run = {"seed": 3, "device": "cpu", "features": {"convert": ["caller_out"]}}
    assert "--features convert=caller_out" in rerun_line(finding, run)


def test_the_pytest_plugin_prints_the_wrappers_line_gives_declared_surfaces_and_refuses_bad_names(pytester):
    from tests.harness.cli.test_pytest_plugin import _plugin_args

    base = [*_plugin_args(), "--mlafuzz-cases", "24", "--mlafuzz-seed", "3", "--mlafuzz-impl", f"convert={IGNORES_OUT}"]
    plain = pytester.runpytest(*base, "--mlafuzz-out", "plain")
    plain.assert_outcomes(passed=1)
    assert "will never be drawn block_stride_rows, compact_to_front, caller_out" in plain.stdout.str()
    declared = pytester.runpytest(*base, "--mlafuzz-features", "convert=caller_out", "--mlafuzz-out", "declared")
    declared.assert_outcomes(failed=1)  # given caller-owned outputs, the wrapper that drops them is caught
    assert "given caller_out (declared)" in declared.stdout.str()
    bad = pytester.runpytest(*base, "--mlafuzz-features", "convert=nope")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "no optional surface 'nope'" in bad.stderr.str()


def test_a_new_surface_is_one_row_that_signature_reading_features_and_the_header_all_see(monkeypatch):
    from mlafuzz.kernels import external
    from mlafuzz.kernels.entry import ImplEntry
    from mlafuzz.reports.console import surface_line

    row = external.Surface(op="writer", name="skip_scale", keywords=("skip_scale",))
    monkeypatch.setattr(external, "SURFACES", (*external.SURFACES, row))

    def writer(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False):
        return None

    assert external.adapt_signature("writer", writer)[1] == frozenset({"skip_scale"})
    assert external.parse_features(["writer=skip_scale"], ops=["writer"]) == {"writer": ("skip_scale",)}
    entry = ImplEntry(
        op="writer",
        name="w",
        loader=lambda d: writer,
        devices=frozenset({"cpu"}),
        rejects=frozenset(),
        capabilities=frozenset(),
        surfaces_from="opaque",
    )
    assert "will never be drawn skip_scale" in surface_line(external.surface_view(entry))


def test_declared_surfaces_cross_into_worker_processes(tmp_path):
    out = tmp_path / "run"
    args = ["fuzz", "--impl", f"convert={WRAPPER}", "--features", "convert=caller_out", "--device", "cpu"]
    assert main([*args, "--cases", "12", "--seed", "3", "--out", str(out), "--shrink-budget", "0", "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text())["coverage"].get("caller-out", 0) >= 1
