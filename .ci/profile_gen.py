"""Device diagnostics: where a realistic case's generation time goes, per op: torch.profiler
tables of one materialize (by CUDA and CPU time) and cProfile's Python hot spots over 30. Run on
the GPU:  python .ci/profile_gen.py [OP ...]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mlafuzz.harness.bench.harness import realistic_spec
from mlafuzz.harness.ops.table import OPS


def main(ops: list[str]) -> None:
    for name in ops:
        op = OPS.get(name)
        spec = realistic_spec(name)
        for s in range(3):  # warm: pools, rank tables, allocator
            op.materialize(spec, seed=s, device="cuda")
        torch.cuda.synchronize()
        times = []
        for s in range(10):
            t0 = time.perf_counter()
            op.materialize(spec, seed=100 + s, device="cuda")
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        times.sort()
        print(f"=== {name}: materialize ms, min {times[0] * 1e3:.3f} median {times[5] * 1e3:.3f}")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            op.materialize(spec, seed=7, device="cuda")
            torch.cuda.synchronize()
        t = prof.key_averages()
        print(t.table(sort_by="self_cuda_time_total", row_limit=14))
        print(t.table(sort_by="self_cpu_time_total", row_limit=14))
        prof_py = cProfile.Profile()
        prof_py.enable()
        for s in range(30):
            op.materialize(spec, seed=200 + s, device="cuda")
        torch.cuda.synchronize()
        prof_py.disable()
        stats = pstats.Stats(prof_py)
        stats.sort_stats("tottime").print_stats(22)
        stats.sort_stats("cumulative").print_stats("mlafuzz", 30)  # our functions, by their whole time


if __name__ == "__main__":
    main(sys.argv[1:] or ["convert", "gather", "writer"])
