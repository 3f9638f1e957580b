"""`mlafuzz bench --harness`: what checking a realistic case costs, end to end and by stage.

For each op, cases at the realistic shape (its row's ``bench.realistic``) are generated on
the GPU and checked the way a fuzz run checks them, in this process. Printed
per op, medians over the cases: cases/s end to end (each case made and checked
once, timed as a whole), the time to generate a case and the kernel alone (both
in the steady state: medians of repeats after warm-up), the check
(``check_call``: everything a fuzz run does for a case but generate it), and each stage's host time (a
profiled check's ``mlafuzz::<stage>`` scopes, harness/check/stages.py);
checks/kernel = (check - kernel) / kernel and generate/kernel; the torch ops
one materialize launches; then each part's share of the end-to-end time
(generate, the kernel, the rest of the check, and the check's stages).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

REPEATS = 5  # timings of the kernel and of check_call per case, their median kept
WARM = 5  # untimed checks of each case before its timed ones
STAGES = ("run", "rerun", "inputs", "oracle", "guards")


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _drop(_: object) -> None:
    """Lets a made case go at once (its memory back to the allocator before the next is made)."""


def _stage_ms(check: Callable[[], object]) -> dict[str, float]:
    """Host ms of each stage of one profiled check (the second: the first pays the profiler's start)."""
    from torch.profiler import ProfilerActivity, profile

    from mlafuzz.harness.check.stages import PREFIX

    for _ in range(2):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            check()
            torch.cuda.synchronize()
    out = {s: 0.0 for s in STAGES}
    for ev in prof.key_averages():
        if ev.key.startswith(PREFIX) and ev.key[len(PREFIX) :] in out:
            out[ev.key[len(PREFIX) :]] += ev.cpu_time_total / 1e3
    return out


def _generate_ops(make: Callable[[], object]) -> int:
    """Torch ops one materialize launches (aten calls at the top of the dispatcher, profiled)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        make()
        torch.cuda.synchronize()
    return sum(1 for ev in prof.events() if ev.name.startswith("aten::") and ev.cpu_parent is None)


def _shares(med: dict[str, float]) -> str:
    """Each part's share of a case's end-to-end time (generate + check)."""
    total = max(med["generate"] + med["check"], 1e-9)
    parts = [("generate", med["generate"]), ("kernel", med["kernel"]), ("rest of check", med["check"] - med["kernel"])]
    stages = ", ".join(f"{s} {100 * med[s] / total:.0f}%" for s in STAGES if med.get(s))
    return (
        "  share of end to end: "
        + ", ".join(f"{n} {100 * max(v, 0.0) / total:.0f}%" for n, v in parts)
        + (f" (stages, host: {stages})" if stages else "")
    )


def ours(op: Any) -> str:
    """The implementation bench times as ours: the op row's (a one-line error for a row without)."""
    if op.ours is None or op.bench is None:
        raise ValueError(f"mlafuzz bench: op {op.name!r} has no bench workload in its op table row")
    return op.ours


def bench_harness(ops: list[str], *, cases: int = 4, seed: int = 0, profile: bool = False) -> list[str]:
    from mlafuzz.harness.check.compare import Policy
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.fuzz import case_seed
    from mlafuzz.harness.drive.run import check_call
    from mlafuzz.harness.memory.guards import PATTERNS
    from mlafuzz.harness.ops.table import OPS

    session = Session(table=OPS)
    cols = ("cases/s", "generate", "kernel", "check", *STAGES)
    lines = [
        f"{'op':<8} " + " ".join(f"{c:>9}" for c in cols) + f" {'gen/kernel':>11} {'checks/kernel':>14} {'gen ops':>8}",
        "  ms per case, medians. cases/s: end to end (generate + check, once each) over the timed cases."
        " generate, kernel, check: steady state (medians of repeats after WARM untimed ones); check: the"
        " runner's check_call, the kernel timed alone on ready arguments; stages: host ms of a profiled check. checks/kernel = (check - kernel) / kernel."
        " gen ops: torch ops of one materialize (the targets: generate <= 5x the kernel).",
    ]
    profiles: list[str] = []
    for op_name in ops:
        op = OPS.get(op_name)
        entry = session.entry(op_name, ours(op))
        fn = session.load(entry, "cuda")
        rows: dict[str, list[float]] = {k: [] for k in cols}
        walls = []
        spec = op.bench.realistic()
        for i in range(cases + 1):  # case 0 warms up (JIT, extension load)
            s = case_seed(seed, op_name, i)
            make = lambda: op.materialize(spec, seed=s, device="cuda")  # noqa: E731
            t_start = time.perf_counter()
            case, _ = _timed(make)
            check = lambda: check_call(
                session=session,
                op=op,
                case=case,
                entry=entry,
                fn=fn,  # noqa: E731
                policy=Policy(),
                rerun=False,
            )
            findings, t_first = _timed(check)
            walls_case = time.perf_counter() - t_start
            if findings:
                raise RuntimeError(
                    f"bench --harness: our {op_name} drew findings on a realistic case: {findings[0].message}"
                )
            # The kernel alone, on ready arguments; everything else is the harness's cost.
            args = {
                **case.cloned_tensors(),
                **{k: g.view for k, g in (op.guarded(case, PATTERNS[0]) if op.guarded else {}).items()},
            }
            sub = session.sub("cuda")
            for _ in range(WARM):
                op.invoke(fn, case, args, sub)
            t_kernel = statistics.median(_timed(lambda: op.invoke(fn, case, args, sub))[1] for _ in range(REPEATS))
            args = None
            t_checks = [_timed(check)[1] for _ in range(WARM + REPEATS)][WARM:]
            # Generation timed as the kernel and the check are: the steady state, the median of
            # REPEATS after WARM (each result dropped before the next is made, as a fuzz run does).
            t_gens = [_timed(lambda: _drop(make()))[1] for _ in range(WARM + REPEATS)]
            t_gen = statistics.median(t_gens[WARM:])
            stages = _stage_ms(check)
            if i == 0:
                continue
            walls.append(walls_case)
            values = {
                "generate": t_gen * 1e3,
                "kernel": t_kernel * 1e3,
                "check": statistics.median(t_checks) * 1e3,
                **stages,
            }
            for k, v in values.items():
                rows[k].append(v)
        med = {k: statistics.median(v) for k, v in rows.items() if v}
        med["cases/s"] = cases / sum(walls)
        gen_ops = _generate_ops(lambda: op.materialize(spec, seed=seed, device="cuda"))
        checks = (med["check"] - med["kernel"]) / max(med["kernel"], 1e-9)
        gen = med["generate"] / max(med["kernel"], 1e-9)
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            for _ in range(2):  # the first profile pays the profiler's own start-up: keep the second
                with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    check()
                    torch.cuda.synchronize()
            table = prof.key_averages()
            profiles.append(f"--- {op_name}: one check_call, by self CUDA time ---")
            profiles.append(table.table(sort_by="self_cuda_time_total", row_limit=12))
            profiles.append(f"--- {op_name}: by CPU time (total) ---")
            profiles.append(table.table(sort_by="cpu_time_total", row_limit=15))
        lines.append(
            f"{op_name:<8} " + " ".join(f"{med[c]:>9.2f}" for c in cols) + f" {gen:>11.2f} {checks:>14.2f} {gen_ops:>8}"
        )
        lines.append(_shares(med))
    return lines + profiles
