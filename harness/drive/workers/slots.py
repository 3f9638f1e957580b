"""How many workers a run gets per device, and the header line that says why."""

from __future__ import annotations

import os
from dataclasses import dataclass

# The default worker count per GPU (``slot_plan``): the host's cores shared among the GPUs (one
# kept for the parent's loop), the GPU's memory over what a worker may hold, and a cap: a
# fuzz case is host-bound (~1 ms of Python per case), so workers scale with cores until the GPU's
# queue or the parent's loop saturates. WORKER_CAP is the knee measured on the H200 (README).
WORKER_CAP = 8
WORKER_BYTES = 9 << 30  # a worker's CUDA context and cached memory: it trims to share.TRIM_BYTES (8 GiB)


@dataclass(frozen=True, kw_only=True)
class SlotPlan:
    """How many workers a device gets, and the numbers that decided it (the run's header)."""

    per_device: int
    devices: int
    cores: int
    memory_bytes: int  # the smallest memory of the devices (0: not a GPU)
    chosen: bool  # the user gave --workers

    def line(self, slots: list[str]) -> str:
        """The header's worker line: '8 workers on cuda:0 (16 cores, 139 GiB free: ...)'."""
        n = len(slots)
        head = f"{n} worker{'s' if n != 1 else ''} on {','.join(dict.fromkeys(slots))}"
        if self.chosen:
            return head + " (--workers)"
        if not self.memory_bytes:
            return head + " (--workers N for more)"
        return (
            f"{head} ({self.cores} cores, {self.memory_bytes / (1 << 30):.0f} GiB: per GPU min(cores - 1 over"
            f" GPUs, memory / {WORKER_BYTES >> 30} GiB, {WORKER_CAP}); --workers N to change)"
        )


def plan_slots(*, gpus: int, cores: int, memory_bytes: int, cap: int = WORKER_CAP) -> int:
    """Workers per GPU for a run without --workers: min(the cores each GPU gets, one kept for the
    parent; the memory of the smallest GPU over WORKER_BYTES; ``cap``), at least 1."""
    per_gpu_cores = (max(cores - 1, 1)) // max(gpus, 1)
    by_memory = memory_bytes // WORKER_BYTES
    return max(1, min(per_gpu_cores, by_memory, cap))


def host_cores() -> int:
    """The cores this process may run on (a container's CPU set, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def slot_plan(*, device: str, workers: int | None) -> SlotPlan:
    """The worker count ``device_slots`` uses, with its reasons."""
    cores = host_cores()
    if device != "cuda":
        return SlotPlan(per_device=workers or 1, devices=1, cores=cores, memory_bytes=0, chosen=workers is not None)
    import torch

    count = torch.cuda.device_count()
    if workers is not None:
        return SlotPlan(per_device=1, devices=workers, cores=cores, memory_bytes=0, chosen=True)
    # The GPUs' sizes, not their free memory: asking that would open a CUDA context on every GPU in
    # this process for the whole run (workers share a GPU's memory through memory/share.py).
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    per = plan_slots(gpus=count, cores=cores, memory_bytes=memory)
    return SlotPlan(per_device=per, devices=count, cores=cores, memory_bytes=memory, chosen=False)


def device_slots(*, device: str, workers: int | None, plan: SlotPlan | None = None) -> list[str]:
    """Device strings for the workers: ``workers`` processes spread over the GPUs, or without it
    ``plan_slots``' count on each GPU (1 on the CPU: the interpreter's cases are CPU-bound)."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        plan = plan or slot_plan(device=device, workers=workers)
        n = workers or plan.per_device * count
        return [f"cuda:{i % count}" for i in range(n)]
    return ["cpu"] * (workers or 1)
