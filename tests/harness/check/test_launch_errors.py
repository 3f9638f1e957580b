"""LAUNCH_ERROR: a CUDA error an implementation's call left pending is charged to that call.

On the CPU a fake runtime (tests/support/fake_cuda.py) stands in for the CUDA
runtime's last-error slot: a planted writer leaves an error in it the way
vLLM's writer does on zero tokens (a zero-size grid, never checked), and the
harness must take it right after the call, before any op of its own, on the
full path and on the fast path, without adding a device sync to the fast path.
The gpu tests run the real thing: the writer_zero_grid mutant of the catalog.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mlafuzz.generators.ops.writer import WriterSpec
from mlafuzz.generators.spec import Paging, spec_to_dict
from mlafuzz.harness.check import calls
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.tasks import Task, execute
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops import writer as writer_op
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.registry import Registry, default_registry
from mlafuzz.reports.findings import Kind
from mlafuzz.tests.support.fake_cuda import ZERO_GRID, FakeRuntime
from mlafuzz.tests.support.helpers import INVALID_CLASSES, check_contract, materialize, resolve, run_case, session_with

EMPTY = WriterSpec(num_tokens=0, paging=Paging(block_size=4, spare_blocks=2))
FULL = WriterSpec(num_tokens=6, paging=Paging(block_size=4, spare_blocks=2))


def _fake_entry(runtime: FakeRuntime):
    # Implements one revision (no revision= keyword), like an external writer.
    return dataclasses.replace(
        resolve("writer", "torch"),
        name="fake_zero_grid",
        revisions=None,
        # Its signature is vLLM's writer before 0.33.0, as the catalog's writer_zero_grid: no skip_scale.
        capabilities=resolve("writer", "torch").capabilities - {"skip_scale"},
        loader=lambda device: runtime.zero_grid_writer(),
    )


@pytest.mark.parametrize("fast", [False, True], ids=["full-path", "fast-path"])
def test_an_error_left_pending_by_the_call_is_a_launch_error_charged_to_the_implementation(fast, monkeypatch):
    runtime = FakeRuntime().install(monkeypatch)
    entry = _fake_entry(runtime)
    fn = runtime.zero_grid_writer()
    (finding,) = run_case(case=materialize(EMPTY, 1), entry=entry, fn=fn, rerun=True, fast=fast).findings
    assert finding.kind is Kind.LAUNCH_ERROR and finding.impl == "fake_zero_grid"
    assert finding.cause == "pending_cuda_error" and "invalid configuration argument" in finding.message
    assert runtime.pending is None  # taken: nothing is left for a later CUDA call to trip over
    assert run_case(case=materialize(FULL, 1), entry=entry, fn=fn, rerun=True, fast=fast).findings == ()


@pytest.mark.parametrize("rerun, impl_calls", [(False, 1), (True, 2)])
def test_the_fast_path_takes_pending_errors_without_a_sync_and_keeps_its_one_board_read(rerun, impl_calls, monkeypatch):
    pytest.importorskip("triton")  # the fast room needs it (under its CPU interpreter here)
    runtime = FakeRuntime().install(monkeypatch)
    case = materialize(FULL, 2)
    syncs, reads = [], []
    monkeypatch.setattr(calls, "sync", lambda device: syncs.append(device))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append("torch.cuda.synchronize"))
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.numel()) or tolist(self))
    result = run_case(case=case, entry=resolve("writer", "torch"), rerun=rerun, fast=True)
    assert result.findings == ()
    assert runtime.asked == impl_calls  # one look at the last error per call of the implementation
    assert syncs == [] and len(reads) == 1  # and still the fast path's one sync: its board


def test_the_full_path_syncs_each_call_only_after_taking_its_pending_error(monkeypatch):
    runtime = FakeRuntime().install(monkeypatch)
    order: list[str] = []
    monkeypatch.setattr(calls, "sync", lambda device: order.append("sync"))
    take = runtime.take_pending
    monkeypatch.setattr(calls.cuda_errors, "take_pending", lambda device: order.append("take") or take(device))
    assert run_case(case=materialize(FULL, 2), entry=resolve("writer", "torch"), fast=False).findings == ()
    assert order == ["take", "sync"]  # a sync first would raise the call's error in the harness


def test_a_packed_caches_other_layers_are_read_only_after_the_pending_error_is_taken(monkeypatch):
    # On CUDA the torch.cat that reads the other layers trips over the zero-grid launch's error:
    # read first, it was an EXCEPTION of a valid input instead of the call's LAUNCH_ERROR.
    runtime = FakeRuntime().install(monkeypatch)
    order: list[str] = []
    take = runtime.take_pending
    monkeypatch.setattr(calls.cuda_errors, "take_pending", lambda device: order.append("take") or take(device))
    read = writer_op.other_layers
    monkeypatch.setattr(writer_op, "other_layers", lambda cache: order.append("other_layers") or read(cache))
    packed = dataclasses.replace(EMPTY, layers=2, layer=1, paging=dataclasses.replace(EMPTY.paging, spare_blocks=2))
    fn = runtime.zero_grid_writer()
    (finding,) = run_case(case=materialize(packed, 1), entry=_fake_entry(runtime), fn=fn, fast=False).findings
    assert finding.kind is Kind.LAUNCH_ERROR and order[:2] == ["take", "other_layers"]


def test_a_pending_error_after_an_error_input_is_a_launch_error_too(monkeypatch):
    runtime = FakeRuntime().install(monkeypatch)
    case = materialize(FULL, 3)
    klass = next(k for k in INVALID_CLASSES["writer"] if k.name == "wrong_dtype")

    def refuses_late(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None):
        runtime.leave(ZERO_GRID)  # launched before it looked at the dtype
        raise TypeError("kv_c must be bf16 or fp16")

    found = check_contract(case=case, entry=resolve("writer", "torch"), fn=refuses_late, klass=klass)
    assert [f.kind for f in found] == [Kind.LAUNCH_ERROR]


def _raise_cuda_error(*args, **kwargs):
    raise RuntimeError(
        "CUDA error: invalid configuration argument\nCUDA kernel errors might be asynchronously "
        "reported at some other API call"
    )


def _task(spec: WriterSpec) -> Task:
    return Task(index=0, op="writer", seed=5, impl_ref="torch", device="cpu", spec=spec_to_dict(spec))


def test_a_cuda_error_surfacing_in_a_harness_op_after_the_call_is_the_implementations():
    # As if the call's error had escaped the check and met the oracle's first CUDA op.
    result = execute(_task(FULL), session_with("writer", oracle=_raise_cuda_error))
    (finding,) = result.findings
    assert finding.kind is Kind.LAUNCH_ERROR and finding.cause == "cuda_error_after_call"
    assert finding.impl == "torch" and "harness error" not in finding.message


def test_a_failure_before_any_call_is_the_harnesss_own():
    (finding,) = execute(_task(FULL), session_with("writer", materialize=_raise_cuda_error)).findings
    assert finding.kind is Kind.CRASH and finding.cause == "harness_error"


def test_fuzzing_a_writer_that_leaves_zero_token_launches_unchecked_draws_only_launch_errors(tmp_path, monkeypatch):
    """The run the gpu test below makes with the real mutant (same seed, op and cases), on the fake:
    seed 0 draws num_tokens == 0 within its first 30 writer cases, and each such case is one
    LAUNCH_ERROR of the implementation; no finding says harness error."""
    runtime = FakeRuntime().install(monkeypatch)
    registry = Registry.of((*default_registry().entries_by_key.values(), _fake_entry(runtime)))
    session = Session(table=OPS, registry=registry)
    config = FuzzConfig(ops=("writer",), impls={"writer": "fake_zero_grid"}, device="cpu", cases=30, out_dir=tmp_path)
    summary = fuzz(config, executor=InProcess(session=session))
    found = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    assert summary.cases == 30 and found
    assert {f["kind"] for f in found} == {"LAUNCH_ERROR"} and {f["impl"] for f in found} == {"fake_zero_grid"}
    assert all(f["spec"]["spec"]["num_tokens"] == 0 for f in found)
    assert not any("harness" in f["cause"] or "harness error" in f["message"] for f in found)


# ----------------------------------------------------------------------------- GPU: the real mutant


@pytest.mark.gpu
def test_gpu_writer_zero_grid_is_a_launch_error_taken_right_after_its_call_and_ours_is_clean():
    case = materialize(EMPTY, 1, "cuda")
    (finding,) = run_case(case=case, entry=resolve("writer", "writer_zero_grid"), rerun=True).findings
    assert finding.kind is Kind.LAUNCH_ERROR and finding.cause == "pending_cuda_error"
    # A zero-size grid: "invalid argument" on the H200's driver (what vLLM's writer left pending),
    # "invalid configuration" on others; either way the runtime's own words, named in the finding.
    assert "CUDA error" in finding.message and (
        "invalid argument" in finding.message or "invalid configuration" in finding.message
    )
    torch.zeros(1, device="cuda")  # nothing left pending: a launch check of the harness's own passes
    torch.cuda.synchronize()
    assert run_case(case=case, entry=resolve("writer", "cuda"), rerun=True).findings == ()
    assert run_case(case=materialize(FULL, 1, "cuda"), entry=resolve("writer", "writer_zero_grid")).findings == ()


@pytest.mark.gpu
def test_gpu_fuzzing_writer_zero_grid_draws_launch_error_and_never_a_harness_error(tmp_path, capsys):
    from mlafuzz.harness.cli.main import main

    rc = main(
        [
            "fuzz",
            "--impl",
            "writer=writer_zero_grid",
            "--device",
            "cuda",
            "--cases",
            "30",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert rc == 1
    found = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    assert found and {f["kind"] for f in found} == {"LAUNCH_ERROR"}
    # Taken by the check right after the call (ctypes cudaGetLastError on torch's runtime), never
    # left to surface in a harness op, and never blamed on the harness.
    assert {f["cause"] for f in found} == {"pending_cuda_error"}
    assert all(f["spec"]["spec"]["num_tokens"] == 0 for f in found)
    assert not any("harness error" in f["message"] for f in found)
    assert json.loads((tmp_path / "summary.json").read_text())["cases"] == 30
