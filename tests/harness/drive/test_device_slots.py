"""The default worker count: a GPU run fills the host's cores and the GPU's memory, up to a cap."""

from __future__ import annotations

from mlafuzz.generators.draw import KNOB_PRESETS
from mlafuzz.harness.drive.workers import (
    DEFAULT_BUDGET,
    HUGE_BUDGET,
    SlotPlan,
    budget_for,
    device_slots,
    plan_slots,
)

GIB = 1 << 30


def test_a_16_core_gpu_host_gets_a_worker_per_core_but_the_parents_at_the_default_size():
    # Session 21 (one 16-core H100, default mix): 8 workers 71,534 cases in 30 s, 15 workers 83,312.
    assert DEFAULT_BUDGET.cap == 16
    assert plan_slots(gpus=1, cores=16, memory_bytes=139 * GIB) == 15  # an H200
    assert plan_slots(gpus=1, cores=16, memory_bytes=79 * GIB) == 15  # an H100


def test_large_runs_keep_eight_workers_a_gpu_because_huge_cases_fill_its_memory():
    # 15 workers of a --size large run filled an 80 GB H100 and met CUDA out-of-memory (session 21).
    assert budget_for(KNOB_PRESETS["large"]) is HUGE_BUDGET
    assert budget_for(KNOB_PRESETS["small"]) is budget_for(None) is DEFAULT_BUDGET
    assert plan_slots(gpus=1, cores=16, memory_bytes=139 * GIB, budget=HUGE_BUDGET) == 8
    assert plan_slots(gpus=1, cores=16, memory_bytes=79 * GIB, budget=HUGE_BUDGET) == 8
    assert plan_slots(gpus=1, cores=16, memory_bytes=40 * GIB, budget=HUGE_BUDGET) == 4


def test_few_cores_limit_the_workers_and_one_core_stays_with_the_parent():
    assert plan_slots(gpus=1, cores=4, memory_bytes=139 * GIB) == 3
    assert plan_slots(gpus=8, cores=16, memory_bytes=139 * GIB) == 1  # 15 cores over 8 GPUs
    assert plan_slots(gpus=2, cores=32, memory_bytes=139 * GIB) == 15
    assert plan_slots(gpus=1, cores=1, memory_bytes=139 * GIB) == 1


def test_a_small_gpu_limits_the_workers_to_its_memory():
    assert plan_slots(gpus=1, cores=64, memory_bytes=3 * DEFAULT_BUDGET.worker_bytes + GIB) == 3
    assert plan_slots(gpus=1, cores=64, memory_bytes=GIB) == 1  # never none


def test_the_header_line_says_how_many_workers_and_why():
    plan = SlotPlan(per_device=8, devices=1, cores=16, memory_bytes=139 * GIB, chosen=False)
    line = plan.line(["cuda:0"] * 8)
    assert line.startswith("8 workers on cuda:0 (16 cores, 139 GiB:")
    assert "--workers N to change" in line
    assert "memory / 2 GiB, 16)" in line
    large = SlotPlan(per_device=8, devices=1, cores=16, memory_bytes=139 * GIB, chosen=False, budget=HUGE_BUDGET)
    assert "memory / 9 GiB, 8)" in large.line(["cuda:0"] * 8)
    chosen = SlotPlan(per_device=1, devices=3, cores=16, memory_bytes=0, chosen=True)
    assert chosen.line(["cuda:0", "cuda:1", "cuda:0"]) == "3 workers on cuda:0,cuda:1 (--workers)"


def test_a_cpu_run_keeps_one_worker_unless_told():
    assert device_slots(device="cpu", workers=None) == ["cpu"]
    assert device_slots(device="cpu", workers=3) == ["cpu"] * 3
