"""``mlafuzz fuzz``: fuzz implementations against the oracles.

Exit 0: nothing found (or only what the ledger expects); 1: findings; 2: a
usage or environment error (one line); 130 interrupted; 143 stopped by SIGTERM.

Every argument is checked before a worker starts or an implementation runs:
the run folder too. A folder that holds an earlier run is refused unless
``--overwrite`` (its run files are removed first) or ``--resume`` (the run goes
on: drive/resume.py); the default ``./mlafuzz-out``, used when ``--out`` is not
given, is a scratch folder and is cleared with a one-line note.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlafuzz.harness.cli.args import (
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    UsageError,
    nonneg_int,
    nonneg_seconds,
    positive_int,
    positive_seconds,
    shard,
)
from mlafuzz.harness.cli.fuzz_choices import SEED_ENV, default_notes, read_corpus, run_seed, stop_after
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.oracles import revisions

DEFAULT_OUT = "mlafuzz-out"


def add_parser(sub: argparse._SubParsersAction, *, names: tuple[str, ...]) -> None:
    f = sub.add_parser(
        "fuzz",
        help="fuzz implementations against the oracles",
        description="Fuzz implementations against the oracles. Exit 0: nothing found; 1: findings "
        "(appended to OUT/findings.jsonl as they happen); 2: usage or environment error (one line, "
        "before any worker starts); 130 / 143: stopped by Ctrl-C / SIGTERM before any finding "
        "(summary.json still written). A --out that holds an earlier run needs --overwrite or "
        "--resume; the default ./mlafuzz-out is replaced.",
    )
    f.add_argument(
        "--op",
        action="append",
        choices=names,
        help="op to fuzz (repeatable); default: every op with an --impl, else all ops",
    )
    f.add_argument(
        "--impl",
        action="append",
        metavar="OP=REF",
        help="implementation per op: a registered name (see `mlafuzz list`), vllm, module:attr or "
        "path/to/file.py:attr (repeatable); default: ours for the device",
    )
    f.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    f.add_argument("--cases", type=positive_int, help="number of cases to run (this shard)")
    f.add_argument(
        "--budget",
        type=positive_seconds,
        metavar="SECONDS",
        help="wall-clock budget; default 60 s when --cases is not given either",
    )
    f.add_argument(
        "--seed",
        type=nonneg_int,
        help=f"run seed: same seed, same cases (default: ${SEED_ENV} if set, else a fresh one, printed and "
        "recorded in run.json; --resume takes the run's own)",
    )
    f.add_argument(
        "--out",
        metavar="DIR",
        help=f"run folder; one that holds an earlier run is refused unless --overwrite or --resume "
        f"(default ./{DEFAULT_OUT}, a scratch folder: an earlier run there is cleared, with a note)",
    )
    again = f.add_mutually_exclusive_group()
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="--out holds an earlier run: remove its files (findings, summary, bundles) first",
    )
    again.add_argument(
        "--resume",
        action="store_true",
        help="--out holds an earlier run of these same options: go on with it (its counts kept, "
        "its cases not run again; --cases and --budget are for this session); a folder "
        "without a run starts one",
    )
    f.add_argument(
        "--spec",
        metavar="FILE",
        help="run this spec with varying seeds: a spec JSON, a repro bundle's case.json or its folder",
    )
    f.add_argument(
        "--size",
        choices=("small", "large"),
        default="small",
        help="case size knobs: small (CPU, interpreter) or large (realistic GPU sizes)",
    )
    f.add_argument("--ulp", type=nonneg_int, default=0, help="bf16 ulp budget (default 0: bit-exact)")
    f.add_argument(
        "--revision",
        choices=revisions.names(),  # the revision table's, read when the parser is built
        default=NEWEST_REVISION,
        help=f"contract revision (docs/contract.md, Revisions) to judge the implementations under (default the newest,"
        f" {NEWEST_REVISION}); a registry entry that pins one (a mutant of one revision's rule) keeps its own",
    )
    f.add_argument(
        "--shard",
        type=shard,
        default="auto",
        metavar="K/N|auto",
        help="run only shard K of N (0-based); auto (the default): MLAFUZZ_SHARD=K/N, else Buildkite's"
        " BUILDKITE_PARALLEL_JOB/BUILDKITE_PARALLEL_JOB_COUNT, else 0/1",
    )
    f.add_argument("--quiet", action="store_true", help="only the closing summary line (for CI logs)")
    f.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="worker processes (default on cuda: per GPU, min(host cores - 1 over GPUs, GPU memory /"
        " 9 GiB, 8); 1 on cpu); the run's header says how many and why",
    )
    f.add_argument(
        "--in-process",
        action="store_true",
        help="run cases in this process: faster start, but a crashing impl takes the run down",
    )
    f.add_argument(
        "--timeout",
        type=positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="per-case limit before a worker is killed and the case reported as TIMEOUT (default 120)",
    )
    f.add_argument(
        "--shrink-budget",
        type=nonneg_seconds,
        default=20.0,
        metavar="SECONDS",
        help="time to minimize each new finding bucket; its repro bundle is written as found first and "
        "replaced by the shrunk case (default 20; 0: no shrinking, bundles as found)",
    )
    f.add_argument(
        "--redzone",
        action="store_true",
        help="GPU fast mode: a red-zone allocator pads every CUDA allocation with canaries, so writes "
        "past outputs the impl allocates itself are OOB_WRITE findings",
    )
    f.add_argument(
        "--sanitizer",
        action="store_true",
        help="GPU exact mode: run cases under compute-sanitizer memcheck with the caching allocator "
        "off; its reports become findings (slow)",
    )
    f.add_argument(
        "--contract",
        action="append",
        metavar="OP=CLASS,...",
        help="hold an external impl to this (weaker) contract instead of the must-reject list of docs/contract.md "
        "(CLASS: the op's error-input classes; OP= alone: it promises to reject nothing)",
    )
    f.add_argument(
        "--max-findings",
        type=positive_int,
        metavar="N",
        help="stop handing out cases once N failing finding buckets are found (the cases in flight "
        "finish; the buckets are shrunk and bundled as usual); like pytest's -x / --maxfail",
    )
    f.add_argument(
        "--corpus",
        metavar="DIR",
        help="replay the repro bundles in DIR (a folder of bundles, or a run folder with bundles/) "
        "against this run's implementations first, then fuzz; their findings count in the run",
    )
    f.add_argument(
        "--ledger",
        metavar="FILE",
        help="expected-failures ledger (TOML or JSON): findings it lists don't fail the run; "
        "entries that matched nothing are printed as stale",
    )
    f.set_defaults(func=cmd_fuzz)


def _say(line: str) -> None:
    print(f"mlafuzz: {line}", file=sys.stderr, flush=True)


def executor_for(args: argparse.Namespace, *, table_ref: str, on_workers: Any = None):
    """The run's executor; ``on_workers(line)`` hears the worker line of a pool (the header's)."""
    from mlafuzz.harness.drive.workers import InProcess, WorkerPool, device_slots, slot_plan

    if (args.redzone or args.sanitizer) and args.device != "cuda":
        raise UsageError("mlafuzz: --redzone and --sanitizer check GPU memory: use them with --device cuda")
    if args.sanitizer:
        from mlafuzz.harness.drive.sanitizer import SanitizerExecutor

        try:
            return SanitizerExecutor(device=args.device)
        except RuntimeError as exc:
            raise UsageError(f"mlafuzz: {exc}") from None
    if args.in_process:
        return InProcess(redzone=args.redzone)
    plan = slot_plan(device=args.device, workers=args.workers)
    slots = device_slots(device=args.device, workers=args.workers, plan=plan)
    if on_workers is not None:
        on_workers(plan.line(slots))
    return WorkerPool(
        devices=slots,
        timeout=args.timeout,
        redzone=args.redzone,
        table_ref=table_ref,
    )


def select_impls(session: Any, texts: list[str] | None, ops: list[str], device: str) -> dict[str, str]:
    """op -> --impl reference, each resolved and loaded once here (its signature checked against
    the op's call) so mistakes surface as one line before any worker starts."""
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.kernels.registry import parse_impl_arg

    chosen: dict[str, str] = {}
    for text in texts or ():
        op, ref = parse_impl_arg(text, ops=session.table.names)
        if op not in ops:
            raise ImplError(f"--impl {text}: op {op!r} is not fuzzed in this run (ops: {', '.join(ops)})")
        if chosen.get(op, ref) != ref:  # a run fuzzes one implementation per op: never drop one silently
            raise ImplError(
                f"--impl {op}={chosen[op]} and --impl {text}: a run fuzzes one implementation per op;"
                f" fuzz each in its own run (its own --out), or both at once with the pytest plugin"
            )
        chosen[op] = ref
    refs = {}
    for op in ops:
        ref = chosen.get(op) or session.default_ref(op, device)
        entry = session.entry(op, ref)
        try:
            session.load(entry, device)
        except ImplError:
            raise
        except Exception as exc:  # e.g. the CUDA extension failed to build: one line, exit 2
            text = str(exc).strip()
            raise ImplError(
                f"--impl {op}={ref}: cannot load on {device}: {type(exc).__name__}: "
                f"{text.splitlines()[0] if text else ''}"
            ) from None
        refs[op] = ref
    return refs


def parse_contracts(texts: list[str] | None, table: Any) -> dict[str, tuple[str, ...]]:
    """--contract OP=CLASS,... -> op -> classes, each class one of the op's error-input classes."""
    rejects: dict[str, tuple[str, ...]] = {}
    for text in texts or ():
        op, sep, classes = text.partition("=")
        if not sep or not op:
            raise UsageError(f"mlafuzz: --contract {text!r}: expected OP=CLASS,... (OP= alone: rejects nothing)")
        if op not in table:
            raise UsageError(f"mlafuzz: --contract {text!r}: unknown op {op!r} (ops: {', '.join(table.names)})")
        known = [k.name for k in table.get(op).invalid]
        names = tuple(c for c in classes.split(",") if c)
        bad = [c for c in names if c not in known]
        if bad:
            raise UsageError(
                f"mlafuzz: --contract {text!r}: op {op!r} has no error-input class {bad[0]!r}"
                f" (classes: {', '.join(known) or 'none'})"
            )
        rejects[op] = names
    return rejects


def read_spec(text: str, table: Any) -> Any:
    """--spec: a spec JSON, a repro bundle's case.json, or a bundle folder; one line naming the file
    when it is none of them."""
    from mlafuzz.generators.spec import SpecError, spec_from_dict

    path = Path(text)
    if path.is_dir():
        if not (path / "case.json").is_file():
            raise UsageError(f"mlafuzz: --spec {text}: a folder without case.json (not a repro bundle)")
        path = path / "case.json"
    if not path.is_file():
        raise UsageError(f"mlafuzz: --spec {text!r}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"mlafuzz: --spec {path}: not valid JSON ({' '.join(str(exc).split())})") from None
    if isinstance(data, dict) and isinstance(data.get("spec"), dict) and "seed" in data and "impl" in data:
        data = data["spec"]  # a bundle's case.json: its spec, in spec_to_dict form, is one field of it
    try:
        return spec_from_dict(data, types=table.spec_types)
    except SpecError as exc:
        raise UsageError(f"mlafuzz: --spec {path}: {exc}") from None


def prepare_out(args: argparse.Namespace) -> tuple[Path, bool]:
    """The run folder, checked before anything runs (nothing is created or removed yet): (path,
    whether it holds an earlier run, which then is cleared or, with --resume, continued)."""
    from mlafuzz.reports.rundir import RunDirError, check_writable, holds_run

    explicit = args.out is not None
    out = Path(args.out if explicit else DEFAULT_OUT)
    try:
        check_writable(out, what="--out" if explicit else f"the default run folder ./{DEFAULT_OUT}")
    except RunDirError as exc:
        raise UsageError(f"mlafuzz: {exc}") from None
    used = holds_run(out)
    if used and explicit and not (args.overwrite or args.resume):
        raise UsageError(
            f"mlafuzz: --out {out} holds an earlier run (its findings would mix with this one's): "
            "pass --overwrite to replace it, --resume to go on with it, or another --out"
        )
    return out, used


def cmd_fuzz(args: argparse.Namespace) -> int:
    started = time.monotonic()  # for the cold-start line: the command's start, imports included
    from mlafuzz.generators.draw import KNOB_PRESETS
    from mlafuzz.harness.check.compare import Policy
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.cli.builds import built_or_not_needed, start_builds
    from mlafuzz.harness.drive.fuzz import FuzzConfig, Shard, fuzz
    from mlafuzz.harness.drive.resume import ResumeError, load_resume
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref
    from mlafuzz.harness.ledger import LedgerError, judge, load_ledger
    from mlafuzz.kernels.registry import parse_impl_arg
    from mlafuzz.reports import console
    from mlafuzz.reports.progress import Progress, ShrinkProgress
    from mlafuzz.reports.rundir import clear_run

    out, used = prepare_out(args)
    seed, drawn = run_seed(args, out, used)
    table = table_from_ref(DEFAULT_TABLE)
    fixed_spec = None
    if args.spec:
        fixed_spec = read_spec(args.spec, table)
        ops = [fixed_spec.op]
        other = [op for op in args.op or () if op != fixed_spec.op]
        if other:
            raise UsageError(f"mlafuzz: --op {other[0]} does not apply: --spec {args.spec} is a {fixed_spec.op} case")
    elif args.op:
        ops = list(dict.fromkeys(args.op))
    elif args.impl:
        ops = list(dict.fromkeys(parse_impl_arg(t, ops=table.names)[0] for t in args.impl))
    else:
        ops = list(table.names)
    cases, budget = args.cases, args.budget
    if cases is None and budget is None:
        budget = 60.0
    try:
        ledger = load_ledger(args.ledger) if args.ledger else None
    except LedgerError as exc:
        raise UsageError(f"mlafuzz: --ledger: {exc}") from None
    rejects = parse_contracts(args.contract, table)
    session = Session(table=table)
    config = FuzzConfig(
        ops=tuple(ops),
        impls=select_impls(session, args.impl, ops, args.device),
        device=args.device,
        cases=cases,
        budget=budget,
        seed=seed,
        out_dir=out,
        knobs=KNOB_PRESETS[args.size],
        policy=Policy(ulp=args.ulp),
        fixed_spec=fixed_spec,
        shard=Shard(index=args.shard[0], count=args.shard[1]),
        shrink_budget=args.shrink_budget,
        rejects=rejects,
        table=table,
        revision=args.revision,
        timeout=None if args.in_process or args.sanitizer else args.timeout,
    )
    corpus, corpus_lines = read_corpus(args, config) if args.corpus else ([], [])
    # A cold GPU start: the CUDA extension builds in the background, said in a line (builds.py).
    build = start_builds(device=args.device, impls=config.impls, say=lambda line: args.quiet or _say(line))
    resume = None
    if used and args.resume:
        try:
            resume = load_resume(out, config.run_json())
        except ResumeError as exc:
            raise UsageError(f"mlafuzz: {exc}") from None
    elif used:
        removed = clear_run(out)
        if not args.overwrite and not args.quiet:
            print(console.cleared_line(out=str(out), removed=removed), file=sys.stderr)
    if not args.quiet:
        print(
            console.start_line(
                impls=config.impls,
                device=args.device,
                seed=seed,
                drawn=drawn,
                notes=default_notes(session, dict(config.impls), args.impl, args.device),
                cases=cases,
                budget=budget,
                out=str(config.out_dir),
                revision=config.revision,
                resumed=resume.summary if resume else None,
            ),
            file=sys.stderr,
        )
    for line in corpus_lines if not args.quiet else ():
        print(line, file=sys.stderr)
    seen: set = set()
    found: list = list(resume.findings) if resume is not None else []  # the verdict is the whole run's

    def show(finding) -> None:
        found.append(finding)
        if not args.quiet and finding.dedup_key not in seen:  # one line per new bucket
            seen.add(finding.dedup_key)
            print(console.finding_line(finding), file=sys.stderr)

    def worker_line(line: str) -> None:
        if not args.quiet:
            where = f"; shard {args.shard[0]}/{args.shard[1]}" if args.shard != (0, 1) else ""
            print(f"mlafuzz: {line}{where}", file=sys.stderr)

    executor = executor_for(args, table_ref=DEFAULT_TABLE, on_workers=worker_line)
    if corpus:
        from mlafuzz.harness.drive.replay import CorpusFirst

        executor = CorpusFirst(executor, corpus)
    progress = Progress(budget=budget, quiet=args.quiet)
    first_case: list[float] = []

    def on_progress(totals: dict, elapsed: float) -> None:
        if not first_case and totals.get("cases", 0) + totals.get("skipped", 0) > 0:
            first_case.append(time.monotonic() - started)
            if not args.quiet:  # how long the start took: builds, worker start-up, compiles
                _say(f"first case done {first_case[0]:.1f} s after the start")
        progress(totals, elapsed)

    shrinking = ShrinkProgress(quiet=args.quiet)
    with terminate_like_interrupt():
        try:
            summary = fuzz(
                config,
                executor=executor,
                on_finding=show,
                on_progress=on_progress,
                stop_when=stop_after(args.max_findings),
                resume=resume,
                on_shrink=lambda event, facts: (progress.close(), shrinking(event, facts)),
                ready=None if build is None else built_or_not_needed(build[0], config.impls),
            )
        finally:
            progress.close()
            executor.close()
    for line in console.bundle_lines(summary.bundles):
        print(line)
    print(console.summary_line(summary.to_json()))
    judgement = judge(found, ledger=ledger, ran=config.impls.items())
    for line in console.verdict_lines(judgement, found):
        print(line, file=sys.stderr)
    if not judgement.passed:
        return EXIT_FINDINGS
    if summary.interrupted:
        return EXIT_TERMINATED if summary.terminated else EXIT_INTERRUPTED
    return EXIT_OK


@contextlib.contextmanager
def terminate_like_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM (CI's cancel) stops the run as Ctrl-C does: summary written,
    workers ended, no traceback; the exit status (143) says it was a SIGTERM."""
    from mlafuzz.harness.drive.fuzz import Terminated

    def stop(signum: int, frame: object) -> None:
        raise Terminated()

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
