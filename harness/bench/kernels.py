"""`mlafuzz bench`: kernel bandwidth against a device-to-device copy.

Effective bandwidth = (bytes that must be read + bytes that must be written) /
median time over repeats after warm-up, timed with CUDA events. Our kernel, the
torch implementation and a copy of the same byte count are measured in the
same run and printed as ratios to the copy. (``--harness``: harness.py.)
"""

from __future__ import annotations

import statistics
import warnings
from typing import Callable

import torch


def time_ms(fn: Callable[[], object], *, warmup: int = 5, repeats: int = 30) -> tuple[float, str]:
    """Median ms per call. Replays of a captured CUDA graph where the call can be captured (so a
    microsecond kernel is not timed as its Python launch overhead); plain launches otherwise
    (an implementation that syncs with the host, like the torch gather, cannot be captured)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    call, how = fn, "launch"
    try:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()  # warm-up on the capture stream
            torch.cuda.synchronize()
            # A call that syncs fails the capture: torch then warns that "the graph is empty" on the
            # way out, a line about our fallback, not the kernel; the table says "launch" instead.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
                with torch.cuda.graph(graph, stream=stream):
                    fn()
        torch.cuda.synchronize()
        call, how = graph.replay, "graph"
    except Exception:  # not capturable: time plain launches
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), how


def bench_order(ops: list[str]) -> list[str]:
    """``ops`` in the order bench prints them: the given order, each op whose ``Bench.beside`` is
    also benched moved right after that op, so one job's cache formats sit together."""
    from mlafuzz.harness.ops.table import OPS

    beside = {n: OPS.get(n).bench.beside if OPS.get(n).bench is not None else None for n in ops}
    order: list[str] = []
    for name in (n for n in ops if beside[n] not in ops):
        order += [name, *(m for m in ops if beside[m] == name)]
    return order


def bench_kernels(ops: list[str], *, repeats: int = 30, variants: bool = False) -> list[str]:
    from mlafuzz.harness.bench.harness import ours
    from mlafuzz.harness.ops.table import OPS
    from mlafuzz.kernels.registry import default_registry

    registry = default_registry()
    lines = [f"{'workload':<36} {'impl':<10} {'median ms':>10} {'GB/s':>8} {'x copy':>7}  timed as"]
    for name in ops:
        op = OPS.get(name)
        impls = {"ours": registry.get(name, ours(op)).load("cuda"), "torch": registry.get(name, "torch").load("cuda")}
        if variants and op.bench.variants is not None:
            impls.update(op.bench.variants())
        wl = op.bench.workload(impls)
        # A copy moving the same bytes: n/2 read plus n/2 written.
        half = wl.nbytes // 2
        # Any bytes will do, and no draw from the default CUDA generator: a capture that failed part way
        # (an implementation that syncs) can leave that generator unusable outside a capture.
        src = torch.full((half,), 0x5A, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_ms, how = time_ms(lambda: dst.copy_(src), repeats=repeats)
        copy_bw = wl.nbytes / copy_ms / 1e6
        lines.append(f"{wl.name:<36} {'copy':<10} {copy_ms:>10.4f} {copy_bw:>8.0f} {1.0:>7.2f}  {how}")
        for name, fn in wl.run.items():
            ms, how = time_ms(fn, repeats=repeats)
            bw = wl.nbytes / ms / 1e6
            lines.append(f"{wl.name:<36} {name:<10} {ms:>10.4f} {bw:>8.0f} {bw / copy_bw:>7.2f}  {how}")
        src = dst = wl = None  # free before the next workload
        torch.cuda.empty_cache()
    return lines
