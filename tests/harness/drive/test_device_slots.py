"""The default worker count: a GPU run fills the host's cores and the GPU's memory, up to a cap."""

from __future__ import annotations

from mlafuzz.harness.drive.workers import WORKER_BYTES, WORKER_CAP, SlotPlan, device_slots, plan_slots

GIB = 1 << 30


def test_an_h200_host_with_16_cores_gets_the_cap_of_workers():
    assert plan_slots(gpus=1, cores=16, memory_bytes=139 * GIB) == WORKER_CAP == 8


def test_few_cores_limit_the_workers_and_one_core_stays_with_the_parent():
    assert plan_slots(gpus=1, cores=4, memory_bytes=139 * GIB) == 3
    assert plan_slots(gpus=8, cores=16, memory_bytes=139 * GIB) == 1  # 15 cores over 8 GPUs
    assert plan_slots(gpus=2, cores=32, memory_bytes=139 * GIB) == 8
    assert plan_slots(gpus=1, cores=1, memory_bytes=139 * GIB) == 1


def test_a_small_gpu_limits_the_workers_to_its_memory():
    assert plan_slots(gpus=1, cores=64, memory_bytes=3 * WORKER_BYTES + GIB) == 3
    assert plan_slots(gpus=1, cores=64, memory_bytes=GIB) == 1  # never none


def test_the_header_line_says_how_many_workers_and_why():
    plan = SlotPlan(per_device=8, devices=1, cores=16, memory_bytes=139 * GIB, chosen=False)
    line = plan.line(["cuda:0"] * 8)
    assert line.startswith("8 workers on cuda:0 (16 cores, 139 GiB:")
    assert "--workers N to change" in line
    chosen = SlotPlan(per_device=1, devices=3, cores=16, memory_bytes=0, chosen=True)
    assert chosen.line(["cuda:0", "cuda:1", "cuda:0"]) == "3 workers on cuda:0,cuda:1 (--workers)"


def test_a_cpu_run_keeps_one_worker_unless_told():
    assert device_slots(device="cpu", workers=None) == ["cpu"]
    assert device_slots(device="cpu", workers=3) == ["cpu"] * 3
