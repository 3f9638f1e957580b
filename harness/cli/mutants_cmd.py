"""``mlafuzz mutants``: fuzz the catalog of planted bugs and report the mutation score.

Exit 1 if a mutant survives or a correct implementation draws a finding. A mutant
the catalog marks as awaiting inputs the generators do not draw yet is reported
as awaiting when it survives, and does not fail the run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlafuzz.harness.cli.args import (
    EXIT_FINDINGS,
    EXIT_OK,
    UsageError,
    nonneg_int,
    nonneg_seconds,
    positive_int,
    positive_seconds,
)


def add_parser(sub: argparse._SubParsersAction, *, names: tuple[str, ...]) -> None:
    m = sub.add_parser(
        "mutants",
        help="fuzz the catalog of planted bugs and report the mutation score",
        description="Fuzz every planted-bug mutant until it draws its expected finding kind "
        "(killed) or its budget ends (survived), and the correct implementations in the "
        "same run. Mutants that crash their process run in worker processes. Exit 1 if a "
        "mutant survives or a correct implementation draws a finding; a mutant whose bug "
        "needs inputs not drawn yet is reported as awaiting them and does not fail the run.",
    )
    m.add_argument(
        "--op",
        action="append",
        choices=names,
        help="only the mutants of this op, and its correct implementation (repeatable; default: all)",
    )
    m.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    m.add_argument(
        "--budget-per-mutant",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="wall-clock budget per mutant and per correct implementation (default 30 unless"
        " --cases-per-mutant is given)",
    )
    m.add_argument(
        "--cases-per-mutant",
        type=positive_int,
        default=None,
        metavar="N",
        help="at most N cases per mutant and per correct implementation (machine-independent)",
    )
    m.add_argument(
        "--shrink-budget",
        type=nonneg_seconds,
        default=5.0,
        metavar="SECONDS",
        help="time to minimize each kill, for the table's last column (0: skip)",
    )
    m.add_argument("--seed", type=nonneg_int, default=0, help="run seed: same seed, same cases (default 0)")
    m.add_argument(
        "--out",
        default="mlafuzz-mutants",
        metavar="DIR",
        help="a run folder per mutant and per correct implementation, each replaced by the next "
        "catalog run (default ./mlafuzz-mutants)",
    )
    m.set_defaults(func=cmd_mutants)


def cmd_mutants(args: argparse.Namespace) -> int:
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.mutants import run_mutants
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, InProcess, WorkerPool, table_from_ref
    from mlafuzz.reports import console
    from mlafuzz.reports.rundir import RunDirError, check_writable

    try:
        check_writable(Path(args.out), what="--out")
    except RunDirError as exc:
        raise UsageError(f"mlafuzz: {exc}") from None
    table = table_from_ref(DEFAULT_TABLE)
    session = Session(table=table)
    # On the GPU a mutant may write out of bounds: isolate it, with the red-zone allocator on. On
    # the CPU the catalog runs in this process, but for the mutants that crash their process.
    executor = (
        WorkerPool(devices=["cuda:0"], timeout=120.0, redzone=True, table_ref=DEFAULT_TABLE)
        if args.device == "cuda"
        else InProcess(session=session)
    )
    pools: list[WorkerPool] = []

    def isolated() -> WorkerPool:
        # The mutants that crash or hang their process get a pool of their own, without the red
        # zone on the GPU: what they show is the process's death, and each restart of a red-zone
        # worker costs more than the crash it reports.
        if not pools:
            device = "cuda:0" if args.device == "cuda" else args.device
            pools.append(WorkerPool(devices=[device], timeout=120.0, table_ref=DEFAULT_TABLE))
        return pools[0]

    budget = args.budget_per_mutant
    if budget is None and args.cases_per_mutant is None:
        budget = 30.0
    ops = list(dict.fromkeys(args.op or table.names))
    print(
        "mlafuzz: the correct implementations first (they must stay clean, and they compile what each"
        " op's cases need before any mutant's clock starts)",
        file=sys.stderr,
        flush=True,
    )
    header: list[str] = []

    def row(r) -> None:
        if not header:
            header.append(console.MUTANTS_HEADER)
            print(console.MUTANTS_HEADER, flush=True)
        print(console.mutant_row(r), flush=True)

    try:  # one warm executor for the whole catalog; a dead worker is replaced
        results, clean = run_mutants(
            session=session,
            ops=ops,
            device=args.device,
            budget=budget,
            cases=args.cases_per_mutant,
            out=Path(args.out),
            seed=args.seed,
            shrink_budget=args.shrink_budget,
            executor=executor,
            isolated=isolated,
            on_result=row,
            on_clean=lambda line: print(f"mlafuzz:   {line}", file=sys.stderr, flush=True),
        )
    finally:
        for e in (executor, *pools):
            e.close()
    for line in console.mutants_score(results):
        print(line)
    for problem in clean:
        print(f"correct implementation drew findings: {problem}")
    if not clean:
        print(f"correct implementations ({', '.join(ops)}): no findings")
    return EXIT_FINDINGS if clean or any(r.failed for r in results) else EXIT_OK
