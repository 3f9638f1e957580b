"""``mlafuzz bench``: kernel bandwidth against a device copy, or the harness's cost per case."""

from __future__ import annotations

import argparse
import sys

from mlafuzz.harness.cli.args import EXIT_OK, UsageError, positive_int, positive_seconds


def add_parser(sub: argparse._SubParsersAction, *, names: tuple[str, ...]) -> None:
    b = sub.add_parser(
        "bench",
        help="GPU: kernel bandwidth vs a device copy, the harness's cost per case, or the fuzz loop's cases/s",
        description="Kernel mode: effective bandwidth of our kernel and the torch implementation as "
        "ratios to a device-to-device copy of the same bytes (CUDA events, median after "
        "warm-up). --harness: cases/s end to end, the per-stage time of generating and "
        "checking realistic cases and each stage's share. --fuzz: cases/s per op of the "
        "real fuzz loop (fuzz --size large, WORKERS workers, our implementations) over "
        "SECONDS per op.",
    )
    b.add_argument(
        "--op",
        action="append",
        choices=names,
        help="only this op (repeatable; default: every op whose op table row has a bench workload)",
    )
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--harness", action="store_true", help="time the harness stages instead of the kernels")
    mode.add_argument(
        "--fuzz", action="store_true", help="run fuzz --size large for --seconds per op and print cases/s per op"
    )
    b.add_argument(
        "--seconds",
        type=positive_seconds,
        default=45.0,
        metavar="SECONDS",
        help="with --fuzz: time per op (default 45)",
    )
    b.add_argument(
        "--workers",
        type=positive_int,
        default=8,
        help="with --fuzz: worker processes, spread over the GPUs (default 8)",
    )
    b.add_argument("--repeats", type=positive_int, default=30, help="timed repeats per kernel (default 30)")
    b.add_argument(
        "--variants",
        action="store_true",
        help="also time every tuning variant of our gather (rows per warp x cache hints)",
    )
    b.add_argument("--cases", type=positive_int, default=8, help="cases per op with --harness (default 8)")
    b.add_argument(
        "--profile",
        action="store_true",
        help="with --harness: also print torch.profiler tables of one checked case per op",
    )
    b.set_defaults(func=cmd_bench, needs_cuda=True)


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from mlafuzz.harness.ops.table import OPS

    benched = tuple(o.name for o in OPS.ops if o.bench is not None)
    lacking = [name for name in args.op or () if name not in benched]
    if lacking:
        raise UsageError(f"mlafuzz: bench has no workload for op {lacking[0]} (ops with one: {', '.join(benched)})")
    from mlafuzz.harness.bench.kernels import bench_kernels, bench_order

    ops = bench_order(list(dict.fromkeys(args.op or benched)))
    if not torch.cuda.is_available():
        raise UsageError("mlafuzz: bench measures GPU kernels: no CUDA device is available here")
    from mlafuzz.harness.bench.fuzz import bench_fuzz
    from mlafuzz.harness.bench.harness import bench_harness

    if args.fuzz:
        lines = bench_fuzz(
            ops,
            seconds=args.seconds,
            workers=args.workers,
            say=lambda line: print(f"mlafuzz bench: {line}", file=sys.stderr, flush=True),
        )
    elif args.harness:
        lines = bench_harness(ops, cases=args.cases, profile=args.profile)
    else:
        lines = bench_kernels(ops, repeats=args.repeats, variants=args.variants)
    print(f"mlafuzz bench on {torch.cuda.get_device_name()}")
    for line in lines:
        print(line)
    return EXIT_OK
