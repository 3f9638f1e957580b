"""`mlafuzz warmup`: what it can do on the CPU, and the cache folders it tells a CI job to keep."""

from __future__ import annotations

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.campaign import cache_folders, needs_extension, start_builds
from mlafuzz.kernels.registry import default_registry

CACHE_VARIABLES = ("TRITON_CACHE_DIR", "MLAFUZZ_CACHE", "TORCH_EXTENSIONS_DIR")


def test_warmup_on_cpu_checks_each_op_and_prints_the_cache_folders_to_keep(tmp_path, monkeypatch, capsys):
    for name in CACHE_VARIABLES:
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    assert main(["warmup", "--device", "cpu", "--op", "convert", "--op", "gather", "--cases", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{name}={tmp_path / name.lower()}" for name in CACHE_VARIABLES]
    assert "nothing compiles" in err and "2 cases of convert, gather at size small" in err
    assert "size large" not in err  # a large case under the interpreter takes minutes
    assert "size small: 2 cases in" in err


def test_warmup_quiet_prints_only_the_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (*CACHE_VARIABLES, "TRITON_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert main(["warmup", "--device", "cpu", "--op", "writer", "--cases", "1", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"TRITON_CACHE_DIR={tmp_path}/.triton/cache",
        f"MLAFUZZ_CACHE={tmp_path}/.cache/mlafuzz",
        f"TORCH_EXTENSIONS_DIR={tmp_path}/.cache/torch_extensions",
    ]


def test_cache_folders_follow_each_tools_own_variables():
    env = {"HOME": "/h", "TRITON_HOME": "/t", "XDG_CACHE_HOME": "/x"}
    assert [folder for _, folder, _ in cache_folders(env)] == [
        "/t/.triton/cache",
        "/h/.cache/mlafuzz",
        "/x/torch_extensions",
    ]


def test_only_a_gpu_run_of_our_cuda_kernels_builds_the_extension():
    registry = default_registry()  # whether an entry needs the extension is its own fact

    def entries(chosen: dict[str, str]) -> dict:
        return {op: registry.get(op, name) for op, name in chosen.items()}

    assert needs_extension(entries({"gather": "cuda"})) and needs_extension(entries({"step": "ours"}))
    assert needs_extension(entries({"writer": "cuda"}))
    assert not needs_extension(entries({"convert": "triton", "gather": "torch", "step": "step_full_req_id"}))
    assert start_builds(device="cpu", entries=entries({"gather": "cuda"}), say=pytest.fail) is None


def test_a_usage_mistake_in_warmup_is_one_line_and_exit_2(capsys):
    assert main(["warmup", "--device", "cpu", "--cases", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_fuzz_run_says_how_long_its_start_took_to_the_first_case(tmp_path, capsys):
    argv = ["fuzz", "--device", "cpu", "--op", "writer", "--cases", "2", "--in-process", "--out", str(tmp_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if "first case done" in line]) == 1
    assert main([*argv, "--overwrite", "--quiet"]) == 0
    assert "first case" not in capsys.readouterr().err
