"""The command line as a user meets it: exit codes, one-line errors, findings on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main

PLANTED = Path(__file__).parents[2] / "support" / "planted"


def _findings(out: Path) -> list[dict]:
    path = out / "findings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_triton_convert_on_cpu_draws_no_finding(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "convert",
            "--impl",
            "convert=triton",
            "--device",
            "cpu",
            "--cases",
            "30",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 0, capsys.readouterr()
    assert "30 cases" in capsys.readouterr().out
    assert _findings(tmp_path) == []


def test_torch_gather_on_cpu_draws_no_finding(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "gather",
            "--impl",
            "gather=torch",
            "--device",
            "cpu",
            "--cases",
            "60",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "60 cases" in out and "cases/s" in out


def test_planted_gather_that_ignores_seq_starts_exits_1_with_a_finding(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "gather",
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "60",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 1
    found = _findings(tmp_path)
    assert found and {"kind", "op", "impl", "case_id", "message"} <= found[0].keys()
    assert found[0]["op"] == "gather" and found[0]["kind"] == "VALUE_MISMATCH"


def test_old_gather_signature_skips_seq_starts_cases_instead_of_failing(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "gather",
            "--impl",
            f"gather={PLANTED / 'old_gather.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "40",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert " 0 skipped" not in out  # some drawn cases need seq_starts and were skipped, said so


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["fuzz", "--op", "attention"], "invalid choice"),
        (["fuzz", "--impl", "gather"], "expected OP=NAME"),
        (["fuzz", "--impl", "softmax=torch"], "unknown op 'softmax'"),
        (["fuzz", "--impl", "gather=nosuchimpl"], "no implementation named 'nosuchimpl'"),
        (["fuzz", "--impl", "gather=/no/such/file.py:gather"], "does not exist"),
        (["fuzz", "--impl", f"gather={PLANTED / 'not_callable.py'}:gather"], "not callable"),
        (["fuzz", "--impl", f"gather={PLANTED / 'not_callable.py'}:missing"], "no attribute 'missing'"),
        (["fuzz", "--impl", "gather=no_such_module_xyz:fn"], "cannot import module"),
        (["fuzz", "--impl", f"gather={PLANTED / 'wrong_signature.py'}:gather"], "cannot take the call gather("),
        (["fuzz", "--op", "convert", "--impl", "gather=torch"], "is not fuzzed in this run"),
        (["fuzz", "--cases", "-3"], "must be >= 1"),
        (["fuzz", "--cases", "0"], "--cases: must be >= 1"),
        (["fuzz", "--workers", "0"], "--workers: must be >= 1"),
        (["fuzz", "--shrink-budget", "-4"], "--shrink-budget: must be >= 0"),
        (["fuzz", "--budget", "-1"], "--budget: must be > 0"),
        (["fuzz", "--timeout", "0"], "--timeout: must be > 0"),
        (["fuzz", "--seed", "-1"], "--seed: must be >= 0"),
        (["fuzz", "--shard", "3/2"], "K/N"),
        (["fuzz", "--shard", "-1/2"], "--shard: expected K/N with 0 <= K < N, got '-1/2'"),
        (["fuzz", "--shard", "1/0"], "--shard: expected K/N"),
        (["fuzz", "--shard", "1"], "--shard: expected K/N"),
        (["fuzz", "--shard", "a/b"], "--shard: expected K/N"),
        (["fuzz", "--contract", "gather=no_such_class"], "has no error-input class 'no_such_class'"),
        (["fuzz", "--contract", "softmax=wrong_dtype"], "unknown op 'softmax'"),
        (["fuzz", "--contract", "gather"], "expected OP=CLASS"),
        (["fuzz", "--spec", "/no/such/spec.json"], "no such file"),
        (["fuzz", "--overwrite", "--resume"], "not allowed with argument"),
        (["mutants", "--cases-per-mutant", "0"], "--cases-per-mutant: must be >= 1"),
        (["mutants", "--budget-per-mutant", "-2"], "--budget-per-mutant: must be > 0"),
        (["mutants", "--shrink-budget", "-1"], "--shrink-budget: must be >= 0"),
        (["replay", "some/bundle", "--timeout", "-5"], "--timeout: must be > 0"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(argv, needle, capsys, tmp_path):
    cases = ["--cases", "1"] if argv[0] == "fuzz" else []
    rc = main(argv + ["--device", "cpu", *cases, "--out", str(tmp_path / "out")] if argv[0] != "replay" else argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert needle in err and len(err.splitlines()) == 1, err


def test_every_option_of_every_command_says_what_it_does():
    import argparse

    from mlafuzz.harness.cli.main import build_parser

    def silent(parser: argparse.ArgumentParser, name: str) -> list[str]:
        out = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    out += silent(sub, sub_name)
            elif not action.help:
                out.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
        return out

    assert silent(build_parser(), "mlafuzz") == []


def test_every_registered_implementation_fits_its_ops_call():
    from mlafuzz.harness.ops.table import OPS
    from mlafuzz.kernels.registry import default_registry

    for entry in default_registry().entries():
        if entry.missing():
            continue
        # The callable as a session loads it (a CUDA entry's Python wrapper too; a revision-following
        # one with its revision bound).
        fn = entry.load(sorted(entry.devices)[0], revision=min(entry.revisions) if entry.revisions else None)
        assert OPS.get(entry.op).call.mismatch(fn) is None, (entry.op, entry.name)


@pytest.mark.parametrize("where", ["case.json", "folder"])
def test_a_bundles_case_json_or_its_folder_is_a_spec(where, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "fuzz",
                "--impl",
                f"gather={PLANTED / 'gather_from_zero.py'}:gather",
                "--device",
                "cpu",
                "--cases",
                "20",
                "--shrink-budget",
                "2",
                "--in-process",
                "--quiet",
                "--out",
                str(run),
            ]
        )
        == 1
    )
    bundle = next((run / "bundles").iterdir())
    spec = bundle / "case.json" if where == "case.json" else bundle
    rc = main(
        [
            "fuzz",
            "--spec",
            str(spec),
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "3",
            "--in-process",
            "--quiet",
            "--out",
            str(tmp_path / "again"),
        ]
    )
    assert rc == 1
    case = json.loads((bundle / "case.json").read_text())
    assert {
        f["spec"]["spec"]["requests"] == case["spec"]["spec"]["requests"] for f in _findings(tmp_path / "again")
    } == {True}


def test_a_spec_that_is_not_json_names_the_option_and_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["fuzz", "--spec", str(bad), "--device", "cpu", "--cases", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mlafuzz: --spec {bad}: not valid JSON") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d["spec"].update(colour="red"), "unknown field 'colour'"),
        (lambda d: d["spec"]["paging"].update(block_size=[64]), "block_size=[64] must be an integer"),
    ],
)
def test_spec_file_with_bad_field_exits_2(edit, needle, tmp_path, capsys):
    from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
    from mlafuzz.generators.spec import spec_to_json

    data = json.loads(spec_to_json(GatherSpec(requests=(GatherRequest(context_len=8, length=8),))))
    edit(data)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    rc = main(["fuzz", "--spec", str(path), "--device", "cpu", "--cases", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1


def test_a_spec_file_replays_that_batch(tmp_path, capsys):
    from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
    from mlafuzz.generators.spec import spec_to_json

    spec = GatherSpec(requests=(GatherRequest(context_len=100, seq_start=40, length=50),))
    path = tmp_path / "spec.json"
    path.write_text(spec_to_json(spec))
    rc = main(
        [
            "fuzz",
            "--spec",
            str(path),
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "3",
            "--out",
            str(tmp_path / "o"),
            "--quiet",
        ]
    )
    assert rc == 1 and len(_findings(tmp_path / "o")) == 3


def test_device_cuda_without_a_gpu_is_an_environment_error(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["fuzz", "--device", "cuda", "--cases", "1", "--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_list_shows_ops_and_implementations(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for needle in ("convert", "gather", "triton", "torch", "cuda", "vllm"):
        assert needle in out


def test_console_script_prints_no_traceback_for_a_user_mistake(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mlafuzz.harness.cli.main", "fuzz", "--impl", "gather=x.py:f", "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_same_seed_reproduces_the_same_cases(tmp_path, capsys):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        main(
            [
                "fuzz",
                "--op",
                "gather",
                "--impl",
                f"gather={PLANTED / 'gather_from_zero.py'}:gather",
                "--device",
                "cpu",
                "--cases",
                "20",
                "--seed",
                "9",
                "--out",
                str(out),
                "--quiet",
                "--in-process",
            ]
        )
        runs.append([(f["case_id"], f["message"]) for f in _findings(out)])
    assert runs[0] and runs[0] == runs[1]


def test_version_is_one_line_and_exit_0(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip().startswith("mlafuzz ")
