"""Workers share one GPU: huge cases take turns in a few slots, and a GPU too full to make a case
gives a counted skip, never a finding."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from mlafuzz.generators.ops.writer import WriterSpec
from mlafuzz.generators.spec import Paging, spec_to_dict
from mlafuzz.harness.drive.tasks import Task, execute
from mlafuzz.harness.memory.share import HUGE_BYTES, GpuShare, head_bytes, slot
from mlafuzz.reports.findings import Kind
from mlafuzz.tests.support.helpers import session_with

SMALL_SPEC = WriterSpec(num_tokens=6, paging=Paging(block_size=4, spare_blocks=2))


def _task(spec: WriterSpec) -> Task:
    return Task(index=0, op="writer", seed=5, impl_ref="torch", device="cpu", spec=spec_to_dict(spec))


def test_a_case_is_huge_by_the_zero_head_below_its_blocks():
    assert head_bytes(SMALL_SPEC) == 0
    huge = WriterSpec(num_tokens=6, paging=Paging(block_size=64, base_block=(1 << 32) // (64 * 656) + 1))
    assert head_bytes(huge) > 1 << 32 and head_bytes(huge) >= HUGE_BYTES
    assert head_bytes(object()) == 0  # a spec with no paged cache


def test_slots_go_to_the_first_free_one_and_a_full_set_makes_the_next_case_wait(tmp_path):
    with slot(tmp_path, "gpu", 2) as a, slot(tmp_path, "gpu", 2) as b:
        assert {a, b} == {0, 1}
        got: list[tuple[int, float]] = []

        def third() -> None:
            with slot(tmp_path, "gpu", 2) as c:
                got.append((c, time.monotonic()))

        t = threading.Thread(target=third)
        t.start()
        t.join(timeout=0.5)
        assert t.is_alive() and got == []  # both slots held: it waits
        released = time.monotonic()
    t.join(timeout=10)
    assert len(got) == 1 and got[0][1] >= released


def test_a_slot_held_by_a_process_that_died_is_free_again(tmp_path):
    import subprocess
    import sys

    code = (
        "import os, sys\nfrom pathlib import Path\nfrom mlafuzz.harness.memory.share import slot\n"
        "with slot(Path(sys.argv[1]), 'gpu', 1):\n    os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", code, str(tmp_path)]).returncode == 9
    with slot(tmp_path, "gpu", 1) as k:
        assert k == 0


def test_execute_holds_the_share_from_making_the_case_to_its_verdict():
    seen: list[str] = []

    @contextlib.contextmanager
    def hold(spec):
        seen.append(f"enter {spec.num_tokens}")
        yield
        seen.append("exit")

    def oracle(case):
        seen.append("oracle")
        return session_with("writer").table.get("writer").oracle(case)

    result = execute(_task(SMALL_SPEC), session_with("writer", oracle=oracle), hold=hold)
    assert result.findings == () and result.skipped is None
    assert seen[0] == "enter 6" and seen[-1] == "exit" and "oracle" in seen[1:-1]


def _oom(*_args, **_kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.")


def test_no_gpu_memory_to_make_a_case_is_a_counted_skip_not_a_finding():
    result = execute(_task(SMALL_SPEC), session_with("writer", materialize=_oom))
    assert result.findings == () and result.skipped.startswith("out of GPU memory making the case")


def test_running_out_of_memory_after_the_call_is_still_reported():
    (finding,) = execute(_task(SMALL_SPEC), session_with("writer", oracle=_oom)).findings
    assert finding.kind is Kind.CRASH and "OutOfMemoryError" in finding.message


class _Props:
    uuid = "GPU-test"
    total_memory = 80 << 30


def _pluggable(*_args, **_kwargs):
    # What torch raises for a cache query while a CUDAPluggableAllocator (the red zone) serves.
    raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats.")


@pytest.mark.parametrize("huge", [False, True], ids=["ordinary", "huge"])
def test_a_red_zone_workers_share_never_asks_the_caching_allocator(monkeypatch, tmp_path, huge):
    # Under --redzone (and mutants --device cuda) every case used to end in a harness error here,
    # so no mutant could be killed on the GPU.
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _dev: _Props())
    monkeypatch.setattr(torch.cuda, "memory_reserved", _pluggable)
    monkeypatch.setattr(torch.cuda, "empty_cache", _pluggable)
    share = GpuShare("cuda:0", lock_dir=tmp_path, caching=False)
    spec = WriterSpec(num_tokens=6, paging=Paging(block_size=64, base_block=HUGE_BYTES // (64 * 656) + 1))
    ran = []
    with share.case(spec if huge else SMALL_SPEC):
        ran.append(True)
    assert ran == [True]
    with pytest.raises(RuntimeError, match="getDeviceStats"):  # the caching share does ask
        with GpuShare("cuda:0", lock_dir=tmp_path).case(spec if huge else SMALL_SPEC):
            pass


@pytest.mark.gpu
def test_a_red_zone_worker_pool_kills_a_gather_mutant_without_harness_errors(tmp_path):
    from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, WorkerPool, table_from_ref

    table = table_from_ref(DEFAULT_TABLE)
    pool = WorkerPool(devices=["cuda:0"], timeout=120.0, redzone=True, table_ref=DEFAULT_TABLE)
    try:
        summary = fuzz(
            FuzzConfig(
                ops=("gather",),
                impls={"gather": "gather_nan_to_zero"},
                device="cuda",
                cases=40,
                seed=0,
                out_dir=tmp_path / "run",
                shrink_budget=0.0,
                table=table,
            ),
            executor=pool,
        )
    finally:
        pool.close()
    assert "NAN_MISMATCH" in summary.by_kind and "CRASH" not in summary.by_kind


@pytest.mark.gpu
def test_gpu_share_has_at_least_one_slot_and_hands_memory_back_after_a_huge_case(tmp_path):
    share = GpuShare("cuda:0", lock_dir=tmp_path)
    assert share.slots >= 1
    huge = WriterSpec(num_tokens=6, paging=Paging(block_size=64, base_block=HUGE_BYTES // (64 * 656) + 1))
    with share.case(huge):
        block = torch.empty(HUGE_BYTES, dtype=torch.uint8, device="cuda:0")
        del block
        assert torch.cuda.memory_reserved(0) >= HUGE_BYTES
    assert torch.cuda.memory_reserved(0) < HUGE_BYTES
