"""`mlafuzz bench --fuzz` (the README's cases/s figure) and --harness's shares, off the GPU."""

from __future__ import annotations

import pytest

from mlafuzz.generators.draw import SMALL
from mlafuzz.harness.bench.fuzz import bench_fuzz
from mlafuzz.harness.bench.harness import _shares
from mlafuzz.harness.cli.main import main


def test_bench_fuzz_runs_the_fuzz_loop_per_op_and_reports_its_cases_per_second():
    lines = bench_fuzz(["gather", "writer"], seconds=2.0, workers=1, device="cpu", knobs=SMALL)
    assert lines[0].split()[:7] == ["op", "cases/s", "cases", "seconds", "findings", "infos", "skipped"]
    assert "--size small --device cpu --workers 1, 2 s per op" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"gather", "writer"}
    for _, rate, cases, seconds, findings, _infos, skipped, impl in rows.values():
        assert float(rate) > 0 and int(cases) > 0 and float(seconds) >= 2.0 and findings == "0" and impl == "torch"
        assert skipped == "0"
        assert abs(float(rate) - int(cases) / float(seconds)) < 0.1 * float(rate) + 0.1


def test_harness_shares_split_the_end_to_end_time():
    med = {
        "generate": 1.0,
        "check": 3.0,
        "kernel": 1.0,
        "run": 1.2,
        "rerun": 0.0,
        "inputs": 0.4,
        "oracle": 0.8,
        "guards": 0.0,
    }
    text = _shares(med)
    assert "generate 25%, kernel 25%, rest of check 50%" in text and "run 30%" in text and "oracle 20%" in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bench", "--fuzz", "--harness"], "not allowed with"),
        (["bench", "--fuzz", "--seconds", "0"], "must be > 0"),
        (["bench", "--fuzz", "--workers", "0"], "must be >= 1"),
    ],
)
def test_bench_mistakes_exit_2_with_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_bench_without_a_gpu_says_so_in_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", "--fuzz"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
