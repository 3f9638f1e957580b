"""``mlafuzz warmup``: build everything a run needs ahead of it, and name the folders to keep.

A fresh GPU runner (what a nightly CI job gets) spends a run's first 20 s or so building: the
CUDA extension (two translation units built side by side, kernels/csrc: 7-16 s on the H100s of
sessions 19-20) and the Triton kernels a case meets (the fused generation kernels, the fast path's
checks, Triton implementations under test: 0.2-1.4 s each, per variant of their constexprs and
int specializations, in every worker that meets it). Both land in
on-disk caches, so a job that keeps those folders between runs starts warm. ``warmup``:

- starts the CUDA extension's build in a background thread (nvcc runs beside everything else);
- meanwhile runs real cases of every op, at both sizes, on the run's default workers, so every
  Triton variant a run meets is compiled, in parallel across the workers, by the same code
  paths a run takes (``--impl`` and ``--seed`` as the run will have them: a user's kernel that
  compiles per option is compiled for that run's deployments, generators/draw.py);
- says what it builds and for how long, and prints the cache folders as NAME=PATH lines on
  stdout (stderr has the words): restore them before ``mlafuzz fuzz``, save them after.

On the CPU nothing compiles (Triton runs interpreted, the extension needs a GPU): warmup loads
the implementations, runs a few cases of each op, and prints the same folders.

``drive/campaign.py``'s ``start_builds`` is the same background build for a cold ``mlafuzz fuzz``, with a line
saying what is being built.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mlafuzz.harness.cli.args import EXIT_OK, EXIT_USAGE, nonneg_int, positive_int
from mlafuzz.harness.drive.campaign import cache_folders, first_line, needs_extension, select_impls, start_builds

SIZES = ("small", "large")
DEFAULT_CASES = {"cuda": 64, "cpu": 2}  # per op and size: enough for the variants the draws meet


def add_parser(sub: argparse._SubParsersAction, *, names: tuple[str, ...]) -> None:
    w = sub.add_parser(
        "warmup",
        help="build the CUDA extension and compile the Triton kernels a run needs; print the cache folders",
        description="Build everything a fuzz run needs ahead of it (a CI job's first step): the CUDA "
        "extension in the background, and every Triton kernel variant the run's cases meet, by running "
        "cases of each op at both sizes on the default workers. Prints what it builds and for how long, "
        "then the cache folders a CI job keeps between runs, one NAME=PATH line each on stdout. Exit 0; "
        "2 when the CUDA extension or an implementation cannot be built or loaded (one line).",
    )
    w.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    w.add_argument("--op", action="append", choices=names, help="only this op (repeatable; default: all)")
    w.add_argument(
        "--impl",
        action="append",
        metavar="OP=REF",
        help="the implementations the run will fuzz (as fuzz's --impl): their kernels are compiled too",
    )
    w.add_argument(
        "--size",
        choices=(*SIZES, "both"),
        help="case sizes to warm (default: both on cuda; small on cpu, where a large case takes minutes)",
    )
    w.add_argument(
        "--cases",
        type=positive_int,
        help=f"cases per op and size (default {DEFAULT_CASES['cuda']} on cuda, {DEFAULT_CASES['cpu']} on cpu)",
    )
    w.add_argument(
        "--seed",
        type=nonneg_int,
        default=None,
        help="the run seed the fuzz run will use: its deployments' kernel variants are compiled (default"
        " $MLAFUZZ_SEED, as fuzz reads it, else 0)",
    )
    w.add_argument("--workers", type=positive_int, default=None, help="worker processes (default: as fuzz)")
    w.add_argument("--quiet", action="store_true", help="only the NAME=PATH lines")
    w.set_defaults(func=cmd_warmup)


def _triton_cached(folder: str) -> int:
    path = Path(folder)
    return sum(1 for _ in path.iterdir()) if path.is_dir() else 0


def cmd_warmup(args: argparse.Namespace) -> int:
    from mlafuzz.generators.draw import KNOB_PRESETS
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, InProcess, WorkerPool, device_slots, table_from_ref

    def say(line: str) -> None:
        if not args.quiet:
            print(f"mlafuzz warmup: {line}", file=sys.stderr, flush=True)

    if args.seed is None:  # the seed a fuzz run in this job will take ($MLAFUZZ_SEED), else 0
        import os

        from mlafuzz.harness.cli.fuzz_choices import SEED_ENV

        text = os.environ.get(SEED_ENV, "").strip()
        args.seed = nonneg_int(text) if text.isdigit() else 0
    device = args.device
    table = table_from_ref(DEFAULT_TABLE)
    ops = list(dict.fromkeys(args.op or table.names))
    session = Session(table=table)
    impls = select_impls(session, args.impl, ops, device)
    size_arg = args.size or ("small" if device == "cpu" else "both")
    sizes = SIZES if size_arg == "both" else (size_arg,)
    cases = args.cases or DEFAULT_CASES[device.split(":")[0]]
    folders = cache_folders()
    t0 = time.monotonic()
    if device == "cpu":
        say(
            "on the CPU nothing compiles (Triton runs interpreted; the CUDA extension needs a GPU): loading the"
            f" implementations and running {cases} case(s) per op and size to check them"
        )
    else:
        before = _triton_cached(folders[0][1])
        say(f"Triton's cache {folders[0][1]} holds {before} kernel folders before this warmup")
    entries = {op: session.entry(op, ref) for op, ref in impls.items()}
    build = start_builds(device=device, entries=entries, say=say) if device != "cpu" else None
    if device != "cpu" and build is None and needs_extension(entries):
        say("the CUDA extension is built already (loading it takes about a second)")
    slots = device_slots(device=device, workers=args.workers)
    executor = InProcess() if device == "cpu" else WorkerPool(devices=slots, timeout=600.0, table_ref=DEFAULT_TABLE)
    found = 0
    try:
        with tempfile.TemporaryDirectory(prefix="mlafuzz-warmup-") as tmp:
            for size in sizes:
                total = cases * len(ops)
                what = f"{'checking' if device == 'cpu' else 'compiling Triton kernels with'} {total} cases"
                say(f"{what} of {', '.join(ops)} at size {size} on {len(slots)} worker(s) ...")
                start = time.monotonic()
                shown = [start]

                def progress(summary: dict[str, Any], elapsed: float, start: float = start, shown=shown) -> None:
                    now = time.monotonic()
                    if now - shown[0] >= 5.0:
                        shown[0] = now
                        say(f"  ... size {size}: {summary.get('cases', 0)}/{total} cases after {now - start:.0f} s")

                summary = fuzz(
                    FuzzConfig(
                        ops=tuple(ops),
                        impls=impls,
                        device=device,
                        cases=total,
                        seed=args.seed,
                        out_dir=Path(tmp) / size,
                        knobs=KNOB_PRESETS[size],
                        shrink_budget=0.0,
                        table=table,
                        shares=dict.fromkeys(ops, 1),  # --cases is per op: each op its cases, whatever its share
                    ),
                    executor=executor,
                    on_progress=progress,
                )
                found += summary.findings
                say(f"size {size}: {summary.cases} cases in {time.monotonic() - start:.1f} s")
    finally:
        executor.close()
    if build is not None:
        thread, outcome = build
        thread.join()
        if outcome.get("error") is not None:
            print(f"mlafuzz: error: the CUDA extension did not build: {first_line(outcome['error'])}", file=sys.stderr)
            return EXIT_USAGE
    if device != "cpu":
        say(f"Triton's cache now holds {_triton_cached(folders[0][1])} kernel folders")
    if found:
        say(f"{found} findings on the way (not judged here: `mlafuzz fuzz` reports them)")
    say(
        f"done in {time.monotonic() - t0:.1f} s. Cache folders a CI job keeps between runs (restore before"
        " `mlafuzz fuzz`, save after):"
    )
    for name, folder, what in folders:
        say(f"  {name}: {what}")
        print(f"{name}={folder}")
    return EXIT_OK
