"""How many workers a run gets per device, and the header line that says why."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# The default worker count per GPU (``slot_plan``): the host's cores shared among the GPUs (one
# kept for the parent's loop), the GPU's memory over what one worker may hold, and a cap, the
# last two by the run's case sizes (``WorkerBudget``).
#
# Without MPS a GPU runs one process's context at a time, and a fuzz case is short work between
# host syncs, so switching contexts is what limits a run at the default size: more workers keep
# more work queued per switch. Session 21, one 16-core H100, the default mix, 30 s warm: 4 workers
# 43,896 cases, 8 71,534, 12 82,878, 15 83,312; cold (60 s) at 15 workers 171,761. A worker held
# at most 672 MiB of GPU memory there.
#
# ``--size large`` puts 1 case in 20 on a 2.1 or 4.3 GB cache head: a worker then held up to
# 9.95 GB (median 7.5 GB), and 15 workers on that 80 GB H100 ran out of memory, so those runs keep
# the budget measured safe on the H200 before (9 GiB a worker, at most 8).


@dataclass(frozen=True, kw_only=True)
class WorkerBudget:
    """What one worker may hold on its GPU, and the most workers a GPU gets, for a run's sizes."""

    worker_bytes: int  # a worker's CUDA context and cached memory
    cap: int


DEFAULT_BUDGET = WorkerBudget(worker_bytes=2 << 30, cap=16)
HUGE_BUDGET = WorkerBudget(worker_bytes=9 << 30, cap=8)  # a worker trims to share.TRIM_BYTES (8 GiB)


def budget_for(knobs: Any) -> WorkerBudget:
    """The budget of a run drawn with ``knobs``: HUGE_BUDGET when its cases can sit on a huge cache
    head (a ``base_offsets`` past share.HUGE_BYTES: ``--size large``), else DEFAULT_BUDGET."""
    from mlafuzz.harness.memory.share import HUGE_BYTES

    huge = knobs is not None and max(knobs.base_offsets, default=0) >= HUGE_BYTES
    return HUGE_BUDGET if huge else DEFAULT_BUDGET


@dataclass(frozen=True, kw_only=True)
class SlotPlan:
    """How many workers a device gets, and the numbers that decided it (the run's header)."""

    per_device: int
    devices: int
    cores: int
    memory_bytes: int  # the smallest memory of the devices (0: not a GPU)
    chosen: bool  # the user gave --workers
    budget: WorkerBudget = DEFAULT_BUDGET

    def line(self, slots: list[str]) -> str:
        """The header's worker line: '15 workers on cuda:0 (16 cores, 139 GiB: ...)'."""
        n = len(slots)
        head = f"{n} worker{'s' if n != 1 else ''} on {','.join(dict.fromkeys(slots))}"
        if self.chosen:
            return head + " (--workers)"
        if not self.memory_bytes:
            return head + " (--workers N for more)"
        return (
            f"{head} ({self.cores} cores, {self.memory_bytes / (1 << 30):.0f} GiB: per GPU min(cores - 1 over"
            f" GPUs, memory / {self.budget.worker_bytes >> 30} GiB, {self.budget.cap}); --workers N to change)"
        )


def plan_slots(*, gpus: int, cores: int, memory_bytes: int, budget: WorkerBudget = DEFAULT_BUDGET) -> int:
    """Workers per GPU for a run without --workers: min(the cores each GPU gets, one kept for the
    parent; the memory of the smallest GPU over the budget's bytes per worker; the budget's cap),
    at least 1."""
    per_gpu_cores = (max(cores - 1, 1)) // max(gpus, 1)
    by_memory = memory_bytes // budget.worker_bytes
    return max(1, min(per_gpu_cores, by_memory, budget.cap))


def host_cores() -> int:
    """The cores this process may run on (a container's CPU set, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def slot_plan(*, device: str, workers: int | None, knobs: Any = None) -> SlotPlan:
    """The worker count ``device_slots`` uses, with its reasons (``knobs``: the run's case sizes,
    which pick its ``WorkerBudget``; None: the default size's)."""
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
    budget = budget_for(knobs)
    per = plan_slots(gpus=count, cores=cores, memory_bytes=memory, budget=budget)
    return SlotPlan(per_device=per, devices=count, cores=cores, memory_bytes=memory, chosen=False, budget=budget)


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
