"""Device diagnostics: where a default fuzz run's case time goes, per op, in one process.
Runs the same tasks a `mlafuzz fuzz` run draws (default knobs, our implementations) through
``execute`` here, times each op's steady state and prints cProfile's hot spots.
Run on the GPU:  python .ci/profile_fuzz.py [--cases N] [--size large] [--gpu-top K] [OP ...]
--gpu-top K also prints the K kernels with the most GPU time over the profiled cases (torch.profiler);
--syncs the CUDA syncs per case and where they come from (torch's sync debug mode).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from mlafuzz.harness.drive.environment import prepare

# Before any Triton kernel is imported: on a CPU they run under the interpreter, as in a fuzz run
# (without it, the step's compiled Triton convert raised on most CPU cases and the timings meant nothing).
prepare("cuda" if torch.cuda.is_available() else "cpu")

from mlafuzz.generators.draw import KNOB_PRESETS  # noqa: E402
from mlafuzz.harness.check.session import Session  # noqa: E402
from mlafuzz.harness.drive.fuzz import FuzzConfig  # noqa: E402
from mlafuzz.harness.drive.tasks import execute  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ops", nargs="*")
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--size", choices=sorted(KNOB_PRESETS), default="small")
    p.add_argument("--gpu-top", type=int, default=0)
    p.add_argument("--syncs", action="store_true")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    session = Session(table=OPS)
    ops = a.ops or list(OPS.names)
    for op in ops:
        cfg = FuzzConfig(
            ops=(op,),
            impls={op: session.default_ref(op, device)},
            device=device,
            cases=a.cases,
            knobs=KNOB_PRESETS[a.size],
        )
        for i in range(20):  # warm: compiles, pools
            execute(cfg.task(i), session)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(20, 20 + a.cases):
            execute(cfg.task(i), session)
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"=== {op}: {a.cases / dt:.0f} cases/s in one process ({1e3 * dt / a.cases:.2f} ms/case)", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(1000, 1000 + a.cases):
            execute(cfg.task(i), session)
        prof.disable()
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats("cumulative").print_stats(a.top)
        st.sort_stats("tottime").print_stats(a.top)
        print(s.getvalue().replace("/opt/torch/.venv/lib/python3.11/site-packages/", ""), flush=True)
        if a.syncs and device == "cuda":
            _syncs(op, cfg, session, cases=min(a.cases, 100))
        if a.gpu_top and device == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
                for i in range(2000, 2000 + min(a.cases, 100)):
                    execute(cfg.task(i), session)
                torch.cuda.synchronize()
            table = tp.key_averages().table(sort_by="self_device_time_total", row_limit=a.gpu_top)
            print(f"=== {op}: GPU time over {min(a.cases, 100)} cases\n{table}", flush=True)


def _syncs(op: str, cfg: FuzzConfig, session: Session, *, cases: int) -> None:
    import collections
    import traceback
    import warnings

    sites: collections.Counter[str] = collections.Counter()

    def seen(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
        if "called a synchronizing CUDA operation" in str(message):  # not the mode's own "prototype" warning
            ours = [f for f in traceback.extract_stack()[:-1] if "mlafuzz" in f.filename]
            where = ours[-1] if ours else None
            sites[f"{where.filename.split('mlafuzz/')[-1]}:{where.lineno} {where.name}" if where else filename] += 1

    old = warnings.showwarning
    warnings.showwarning = seen
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for i in range(3000, 3000 + cases):
                    execute(cfg.task(i), session)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = old
    print(f"=== {op}: {sum(sites.values()) / cases:.1f} CUDA syncs per case; top sites:", flush=True)
    for site, n in sites.most_common(12):
        print(f"  {n / cases:6.2f}  {site}", flush=True)


if __name__ == "__main__":
    main()
