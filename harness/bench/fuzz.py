"""`mlafuzz bench --fuzz`: the fuzz loop's own throughput, cases/s per op, the README's figure.

For each op, the real loop (harness/drive/fuzz.py ``fuzz``, a WorkerPool of
spawned workers on the GPU, ``--size large``, our default implementations,
error inputs and re-runs as a fuzz run has them, no shrinking) runs for a
fixed time; cases/s is the cases it finished over the seconds it took. The
pool is started and warmed once (every worker runs a few cases of the op
first, untimed: process start, CUDA and Triton start-up are not the loop's
steady state), then reused for every op. While each op's timed part runs,
NVML samples the GPU's busy fraction (busy.py): how far the loop is from
GPU-bound, the next step's measure.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from mlafuzz.generators.draw import KNOB_PRESETS, Knobs
from mlafuzz.reports.findings import Severity

WARM_CASES_PER_WORKER = 16  # enough for the common Triton variants to be compiled (and cached on disk)


def bench_fuzz(
    ops: list[str],
    *,
    seconds: float,
    workers: int,
    seed: int = 0,
    device: str = "cuda",
    knobs: Knobs | None = None,
    say: Callable[[str], None] | None = None,
) -> list[str]:
    """Lines to print: cases/s per op (``device`` and ``knobs``: the CLI's are cuda and LARGE).
    ``say`` hears the untimed warm-up's build lines (a fresh machine's CUDA extension: what is
    built, and how long it took), as a fuzz run's header does."""
    from mlafuzz.generators.draw import LARGE
    from mlafuzz.harness.bench.busy import sample_gpu
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.campaign import Campaign, run_campaign
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, WorkerPool, device_slots, table_from_ref

    table = table_from_ref(DEFAULT_TABLE)
    session = Session(table=table)
    knobs = knobs or LARGE
    size = next((name for name, k in KNOB_PRESETS.items() if k == knobs), "custom")
    devices = device_slots(device=device, workers=workers)
    lines = [
        f"{'op':<8} {'cases/s':>9} {'cases':>7} {'seconds':>8} {'findings':>8} {'infos':>6} {'skipped':>7}"
        f" {'gpu busy':>8}   impl",
        f"  fuzz --size {size} --device {device} --workers {len(devices)}, {seconds:g} s per op after"
        f" {WARM_CASES_PER_WORKER} untimed cases per worker; error inputs and re-runs as in a fuzz run, no"
        " shrinking",
    ]
    pool = WorkerPool(devices=devices, timeout=120.0, table_ref=DEFAULT_TABLE)
    try:
        with tempfile.TemporaryDirectory(prefix="mlafuzz-bench-") as tmp:
            for op in ops:
                # Our default implementation, no shrinking; each campaign runs on the one warm pool,
                # kept across ops (a pool per campaign would time its start-up).
                common = dict(ops=(op,), device=device, knobs=knobs, shrink_budget=0.0, timeout=None)
                warm = Campaign(
                    cases=WARM_CASES_PER_WORKER * len(devices),
                    seed=seed + 1,
                    out_dir=Path(tmp) / f"{op}-warm",
                    **common,
                )
                run_campaign(warm, session=session, executor=pool, say=say)
                found: list = []
                with sample_gpu(devices) as sampler:  # NVML, in a thread: the timed part only
                    timed = Campaign(budget=seconds, seed=seed, out_dir=Path(tmp) / op, **common)
                    result = run_campaign(timed, session=session, executor=pool, on_finding=found.append)
                summary, impls = result.summary, result.impls
                busy = sampler.result()
                lines.append(
                    f"{op:<8} {summary.rate:>9.1f} {summary.cases:>7} {summary.seconds:>8.1f}"
                    f" {summary.findings:>8} {summary.infos:>6} {summary.skipped:>7}"
                    f" {busy.text() if busy.fraction is not None else 'n/a':>8}   {impls[op]}"
                )
                if busy.fraction is None and device == "cuda":
                    lines.append(f"  gpu busy: {busy.text()}")
                # Failures only: an info (an input outside the contract that ran) is worth a count.
                errors = [f for f in found if f.severity is Severity.ERROR]
                lines += [f"  finding: {f.kind.value} {f.message[:200]}" for f in errors[:3]]
    finally:
        pool.close()
    return lines
