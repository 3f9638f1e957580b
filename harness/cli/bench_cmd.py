"""``mlafuzz bench``: kernel bandwidth against a device copy, or the harness's cost per case."""

from __future__ import annotations

import argparse

from mlafuzz.harness.cli.args import EXIT_OK, UsageError, positive_int


def add_parser(sub: argparse._SubParsersAction, *, names: tuple[str, ...]) -> None:
    b = sub.add_parser("bench", help="GPU: kernel bandwidth vs a device copy, or the harness's cost per case",
                       description="Kernel mode: effective bandwidth of our kernel and the torch implementation as "
                                   "ratios to a device-to-device copy of the same bytes (CUDA events, median after "
                                   "warm-up). --harness: cases/s and the per-stage time of checking realistic cases.")
    b.add_argument("--op", action="append", choices=tuple(n for n in names if n != "step"),
                   help="only this op (repeatable; default: convert, gather, writer)")
    b.add_argument("--harness", action="store_true", help="time the harness stages instead of the kernels")
    b.add_argument("--repeats", type=positive_int, default=30, help="timed repeats per kernel (default 30)")
    b.add_argument("--variants", action="store_true",
                   help="also time every tuning variant of our gather (rows per warp x cache hints)")
    b.add_argument("--cases", type=positive_int, default=8, help="cases per op with --harness (default 8)")
    b.add_argument("--profile", action="store_true",
                   help="with --harness: also print torch.profiler tables of one checked case per op")
    b.set_defaults(func=cmd_bench, needs_cuda=True)


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        raise UsageError("mlafuzz: bench measures GPU kernels: no CUDA device is available here")
    from mlafuzz.harness.bench.harness import bench_harness
    from mlafuzz.harness.bench.kernels import bench_kernels

    ops = list(dict.fromkeys(args.op or ["convert", "gather", "writer"]))
    if args.harness:
        lines = bench_harness(ops, cases=args.cases, profile=args.profile)
    else:
        lines = bench_kernels(ops, repeats=args.repeats, variants=args.variants)
    print(f"mlafuzz bench on {torch.cuda.get_device_name()}")
    for line in lines:
        print(line)
    return EXIT_OK
