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
        for _ in range(100):  # pstats prints seconds to 3 decimals: 100 checks make those read as ms per check
            check()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
        print(f"-- {op}: cProfile of 100 checks (times in seconds over all 100 = 10 x ms per check)")
        print("\n".join(line[:160] for line in out.getvalue().splitlines()[:45]))
    # Host cost of the building blocks, 200 calls each, no sync in between except where named.
    from mlafuzz.harness.fingerprint import fingerprints
    from mlafuzz.oracles.fast_writer import _scatter_owners

    small = torch.zeros(16, dtype=torch.int64, device="cuda")
    slots, inv = small[:8], torch.zeros(9, dtype=torch.int64, device="cuda")
    blocks = {"torch.zeros(1)": lambda: torch.zeros(1, device="cuda"),
              "a != b (small)": lambda: small != small,
              "fingerprints (small, Triton)": lambda: fingerprints([small]),
              "a Triton launch, kernel[grid]()": lambda: _scatter_owners[(1,)](slots, 8, 8, inv, 1, BLOCK=1024),
              "torch.cuda.synchronize": torch.cuda.synchronize,
              "tolist (1 int)": lambda: small[:1].tolist()}
    per_call(blocks)


def per_call(blocks: dict, *, calls: int = 200, host_only: bool = False) -> None:
    """Prints us per call of each block, ``calls`` in a row with no sync between; the time
    ends after a final sync, or (``host_only``) when the host has issued the last call."""
    for name, fn in blocks.items():
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if not host_only:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"{name:<34} {(t1 - t0) / calls * 1e6:8.1f} us per call{' (host)' if host_only else ''}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["convert", "gather", "writer"])
