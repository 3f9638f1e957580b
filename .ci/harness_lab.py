"""Where the host time of one fast-path check goes, on the GPU: check_call timed five times in a
row on one realistic case (memo cleared each time), then cProfile of one more. `bash .ci/gpu harnesslab`."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch

from mlafuzz.generators.materialize import materialize
from mlafuzz.harness.bench import OURS, realistic_spec
from mlafuzz.harness.compare import Policy
from mlafuzz.harness.runner import check_call
from mlafuzz.kernels.registry import resolve


def main(ops: list[str]) -> None:
    for op in ops:
        entry = resolve(op, OURS[op])
        fn = entry.load("cuda")
        case = materialize(realistic_spec(op), 1, "cuda")

        def check() -> float:
            case.memo.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            found = check_call(case=case, entry=entry, fn=fn, policy=Policy(), rerun=False)
            torch.cuda.synchronize()
            assert not found, found
            return (time.perf_counter() - t0) * 1e3

        for _ in range(3):
            check()
        print(f"== {op}: check_call ms, five in a row:", " ".join(f"{check():.3f}" for _ in range(5)))
        prof = cProfile.Profile()
        prof.enable()
        check()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
        print("\n".join(line[:160] for line in out.getvalue().splitlines()[:45]))


if __name__ == "__main__":
    main(sys.argv[1:] or ["convert", "gather", "writer"])
