"""`mlafuzz bench --fuzz` (the README's cases/s figure) and --harness's shares, off the GPU."""

from __future__ import annotations

import threading
import time

import pytest

from mlafuzz.generators.draw import SMALL
from mlafuzz.harness.bench.busy import Busy, Sampler, busy_of, gpu_source
from mlafuzz.harness.bench.fuzz import bench_fuzz
from mlafuzz.harness.bench.harness import _shares
from mlafuzz.harness.cli.main import main


def test_bench_fuzz_runs_the_fuzz_loop_per_op_and_reports_its_cases_per_second():
    lines = bench_fuzz(["gather", "writer"], seconds=2.0, workers=1, device="cpu", knobs=SMALL)
    assert lines[0].split()[:9] == ["op", "cases/s", "cases", "seconds", "findings", "infos", "skipped", "gpu", "busy"]
    assert "--size small --device cpu --workers 1, 2 s per op" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"gather", "writer"}
    for _, rate, cases, seconds, findings, _infos, skipped, busy, impl in rows.values():
        assert busy == "n/a"  # not a GPU run
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


def test_the_gpu_busy_fraction_is_the_mean_of_nvmls_percent_readings():
    assert busy_of([0, 50, 100, 50], source="fake").fraction == 0.5
    assert busy_of([120, -5], source="fake").fraction == 0.5  # clamped to 0..100
    assert busy_of([], source="fake").text().startswith("n/a (no sample")
    assert Busy(fraction=0.874, samples=3).text() == "87%"


def test_the_busy_sampler_reads_its_source_in_a_thread_until_the_run_ends():
    readings = iter([100.0, 100.0, 0.0, 0.0] + [0.0] * 1000)
    ticks = threading.Event()

    def source() -> float:
        ticks.set()
        return next(readings)

    with Sampler(source, name="fake", interval=0.001) as sampler:
        assert ticks.wait(5)
        deadline = time.monotonic() + 5
        while len(sampler._readings) < 4 and time.monotonic() < deadline:
            time.sleep(0.001)
    busy = sampler.result()
    assert busy.samples >= 4 and 0.0 <= busy.fraction <= 0.5 and busy.source == "fake"


def test_a_busy_source_that_fails_or_is_missing_reads_n_a_with_the_reason():
    def broken() -> float:
        raise RuntimeError("driver gone")

    with Sampler(broken, name="nvml") as sampler:
        pass
    sampler._thread.join()
    assert sampler.result().text() == "n/a (nvml: RuntimeError: driver gone)"
    assert Sampler(None, reason="no NVML").result().text() == "n/a (no NVML)"
    assert gpu_source(["cpu"])[2] == "not a GPU run"
