"""``mlafuzz fuzz``: fuzz implementations against the oracles.

Exit 0: nothing found (or only what the ledger expects); 1: findings; 2: a
usage or environment error (one line); 130 interrupted; 143 stopped by SIGTERM (a stopped
run with a failing finding exits 1: the finding is the news).

Every argument is checked before a worker starts or an implementation runs:
the run folder too. A folder that holds an earlier run is refused unless
``--overwrite`` (its run files are removed first) or ``--resume`` (the run goes
on: drive/resume.py); the default ``./mlafuzz-out``, used when ``--out`` is not
given, is a scratch folder and is cleared with a one-line note.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
from mlafuzz.harness.cli.fuzz_choices import SEED_ENV, corpus_lines, default_notes, run_seed
from mlafuzz.harness.drive.campaign import AUTO
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.oracles import revisions
from mlafuzz.oracles.formats import writer_rules

DEFAULT_OUT = "mlafuzz-out"


def add_parser(sub: argparse._SubParsersAction, *, names: tuple[str, ...]) -> None:
    f = sub.add_parser(
        "fuzz",
        help="fuzz implementations against the oracles",
        description="Fuzz implementations against the oracles. Exit 0: nothing found; 1: findings "
        "(appended to OUT/findings.jsonl as they happen); 2: usage or environment error (one line, "
        "before any worker starts); 130 / 143: stopped by Ctrl-C / SIGTERM before any failing finding "
        "(summary.json still written). A --out that holds an earlier run needs --overwrite or "
        "--resume; the default ./mlafuzz-out is replaced.",
    )
    f.add_argument(
        "--op",
        action="append",
        choices=names,
        help="op to fuzz (repeatable); default: every op with an --impl, else all ops. Several ops"
        " share the run's time about equally, not its cases: a cheap op runs more cases (each op's"
        " share per round is in docs/contract.md)",
    )
    f.add_argument(
        "--impl",
        action="append",
        metavar="OP=REF",
        help="implementation per op: a registered name (see `mlafuzz list`), vllm, module:attr or "
        "path/to/file.py:attr (repeatable); default: ours for the device",
    )
    f.add_argument(
        "--features",
        action="append",
        metavar="OP=NAME,...",
        help="optional surfaces an --impl takes that its signature does not name (a *args, **kwargs"
        " wrapper): it is given them, e.g. convert=caller_out,block_stride_rows (repeatable; the header"
        " lists each implementation's; names: docs/contract.md, Capabilities)",
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
        choices=(*revisions.names(), AUTO),  # the revision table's, read when the parser is built
        default=None,
        help=f"contract revision (docs/contract.md, Revisions) to judge the implementations under; auto: the"
        f" installed vLLM's release's (MLAFUZZ_VLLM_VERSION wins), the default when an --impl is vllm; else the"
        f" newest, {NEWEST_REVISION}; a registry entry that pins one (a mutant of one revision's rule) keeps its own",
    )
    f.add_argument(
        "--nvfp4-writer",
        choices=writer_rules.names(),  # the nvfp4 writer revisions (oracles/formats/writer_rules.py)
        default=writer_rules.DEFAULT,
        help=f"the nvfp4_writer op's writer revision, <scale rounding>.<quotient> (docs/contract.md, Cache"
        f" formats; default {writer_rules.DEFAULT}, vLLM's CUDA writer's); a case's bundle keeps the one it was"
        f" judged under",
    )
    f.add_argument(
        "--ties",
        choices=("exact", "either"),
        default="exact",
        help="nvfp4_writer: at an exact e2m1 tie accept either neighbouring code, counted apart as an info"
        " ('bit-exact except N ties'), not a failure (either); default exact",
    )
    f.add_argument(
        "--shard",
        type=shard,
        default="auto",
        metavar="K/N|auto",
        help="run only shard K of N (0-based); auto (the default): MLAFUZZ_SHARD=K/N, else Buildkite's"
        " BUILDKITE_PARALLEL_JOB/BUILDKITE_PARALLEL_JOB_COUNT, else 0/1",
    )
    _add_run_options(f)
    _add_judging_options(f)
    f.set_defaults(func=cmd_fuzz, workers_early=lambda a: not a.in_process and not a.sanitizer)


def _add_run_options(f: argparse.ArgumentParser) -> None:
    """How the cases run: workers, isolation, limits, memory checks, what is printed."""
    f.add_argument(
        "--quiet",
        action="store_true",
        help="only the closing summary line and the ledger's verdict, for CI logs (no header,"
        " progress or repro lines: each bundle's replay.txt holds its line)",
    )
    f.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="worker processes (default on cuda: per GPU, min(host cores - 1 over GPUs, GPU memory /"
        " 2 GiB, 16), with --size large min(..., memory / 9 GiB, 8); 1 on cpu); the run's header says"
        " how many and why. On Linux they are forked from a"
        " server that imported torch once; MLAFUZZ_WORKER_START=spawn spawns each instead",
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


def _add_judging_options(f: argparse.ArgumentParser) -> None:
    """What the run is judged against, and what it replays or stops on."""
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
        "entries that matched nothing are printed as stale, those for an implementation not fuzzed as not "
        "applicable. Its entries are recorded in run.json: merge carries them, report judges by them",
    )


def _say(line: str) -> None:
    print(f"mlafuzz: {line}", file=sys.stderr, flush=True)


def parse_contracts(texts: list[str] | None, table: Any) -> dict[str, tuple[str, ...]]:
    """--contract OP=CLASS,... -> op -> classes, each class one of the op's error-input classes."""
    rejects: dict[str, tuple[str, ...]] = {}
    for text in texts or ():
        op, sep, classes = text.partition("=")
        if not sep or not op:
            raise UsageError(f"mlafuzz: --contract {text!r}: expected OP=CLASS,... (OP= alone: rejects nothing)")
        if op not in table:
            raise UsageError(f"mlafuzz: --contract {text!r}: unknown op {op!r} (ops: {', '.join(table.names)})")
        known = [k.name for k in table.get(op).contract_classes]
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


def campaign_of(args: argparse.Namespace) -> tuple[Any, bool, bool]:
    """(the Campaign the options ask for, whether its seed was drawn fresh, whether --out holds an
    earlier run); every option checked here, before anything runs."""
    from mlafuzz.generators.draw import KNOB_PRESETS
    from mlafuzz.harness.drive.campaign import Campaign
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref
    from mlafuzz.harness.ledger import LedgerError, load_ledger

    out, used = prepare_out(args)
    seed, drawn = run_seed(args, out, used)
    table = table_from_ref(DEFAULT_TABLE)
    ops, fixed_spec = fuzzed_ops(args, table)
    try:
        ledger = load_ledger(args.ledger) if args.ledger else None
    except LedgerError as exc:
        raise UsageError(f"mlafuzz: --ledger: {exc}") from None
    campaign = Campaign(
        ops=tuple(ops),
        impls=tuple(args.impl or ()),
        device=args.device,
        cases=args.cases,
        budget=60.0 if args.cases is None and args.budget is None else args.budget,
        seed=seed,
        out_dir=out,
        knobs=dataclasses.replace(KNOB_PRESETS[args.size], nvfp4_writer=args.nvfp4_writer, nvfp4_ties=args.ties),
        ulp=args.ulp,
        fixed_spec=fixed_spec,
        shard=args.shard,
        shrink_budget=args.shrink_budget,
        rejects=parse_contracts(args.contract, table),
        features=tuple(args.features or ()),
        revision=args.revision,
        timeout=args.timeout,
        isolate=not args.in_process,
        workers=args.workers,
        redzone=args.redzone,
        sanitizer=args.sanitizer,
        resume=args.resume,
        corpus=Path(args.corpus) if args.corpus else None,
        ledger=ledger,
        max_findings=args.max_findings,
    )
    return campaign, drawn, used


def fuzzed_ops(args: argparse.Namespace, table: Any) -> tuple[list[str], Any]:
    """(the ops to fuzz, the --spec to run or None): --spec's op, else --op, else the ops of
    --impl, else every op."""
    from mlafuzz.kernels.registry import parse_impl_arg

    if args.spec:
        fixed_spec = read_spec(args.spec, table)
        other = [op for op in args.op or () if op != fixed_spec.op]
        if other:
            raise UsageError(f"mlafuzz: --op {other[0]} does not apply: --spec {args.spec} is a {fixed_spec.op} case")
        return [fixed_spec.op], fixed_spec
    if args.op:
        return list(dict.fromkeys(args.op)), None
    if args.impl:
        return list(dict.fromkeys(parse_impl_arg(t, ops=table.names)[0] for t in args.impl)), None
    return list(table.names), None


class Reporter:
    """What ``mlafuzz fuzz`` prints while a campaign runs: the header, a line per new bucket, the
    workers, the first case's time and the progress line (with --quiet none of it; the summary and verdict lines only)."""

    def __init__(
        self, args: argparse.Namespace, *, session: Any, budget: float | None, started: float, drawn: bool, used: bool
    ) -> None:
        from mlafuzz.reports.progress import Progress, ShrinkProgress

        self.args, self.session, self.started, self.drawn, self.used = args, session, started, drawn, used
        self.quiet = bool(args.quiet)
        self.progress = Progress(budget=budget, quiet=self.quiet)
        self.shrinking = ShrinkProgress(quiet=self.quiet)
        self.seen: set = set()
        self.first_case: float | None = None

    def say(self, line: str) -> None:
        if not self.quiet:
            _say(line)

    def start(self, prepared: Any) -> None:
        from mlafuzz.reports import console

        config, resume = prepared.config, prepared.resume
        if self.quiet:
            return
        if self.used and resume is None and not self.args.overwrite:
            print(console.cleared_line(out=str(config.out_dir), removed=prepared.removed), file=sys.stderr)
        print(
            console.start_line(
                impls=config.impls,
                device=config.device,
                seed=config.seed,
                drawn=self.drawn,
                notes=default_notes(self.session, dict(config.impls), self.args.impl, config.device),
                cases=config.cases,
                budget=config.budget,
                out=str(config.out_dir),
                revision=config.revision,
                release=config.release,
                resumed=resume.summary if resume else None,
            ),
            file=sys.stderr,
        )
        for view in prepared.surfaces:
            print(console.surface_line(view), file=sys.stderr)
        if config.plan is not None:
            print(console.budget_line(config.plan.facts()), file=sys.stderr)
        for line in corpus_lines(prepared, self.args.corpus) if self.args.corpus else ():
            print(line, file=sys.stderr)

    def workers(self, line: str) -> None:
        shard = self.args.shard
        self.say(f"{line}; shard {shard[0]}/{shard[1]}" if shard != (0, 1) else line)

    def finding(self, finding: Any) -> None:
        from mlafuzz.reports import console

        if not self.quiet and finding.dedup_key not in self.seen:  # one line per new bucket
            self.seen.add(finding.dedup_key)
            print(console.finding_line(finding), file=sys.stderr)

    def tick(self, totals: dict, elapsed: float) -> None:
        if self.first_case is None and totals.get("cases", 0) + totals.get("skipped", 0) > 0:
            self.first_case = time.monotonic() - self.started
            self.say(f"first case done {self.first_case:.1f} s after the start")  # builds, start-up, compiles
        self.progress(totals, elapsed)

    def shrink(self, event: str, facts: dict) -> None:
        self.progress.close()
        self.shrinking(event, facts)


def cmd_fuzz(args: argparse.Namespace) -> int:
    # The command's start (main's, before torch is imported), else now: a budget and the cold-start
    # line count from it, imports and the CUDA check included.
    started = getattr(args, "started", None) or time.monotonic()
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.campaign import CampaignError, run_campaign
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref
    from mlafuzz.reports import console

    campaign, drawn, used = campaign_of(args)
    session = Session(table=table_from_ref(DEFAULT_TABLE))  # the header's notes read its registry
    report = Reporter(args, session=session, budget=campaign.budget, started=started, drawn=drawn, used=used)
    with terminate_like_interrupt():
        try:
            result = run_campaign(
                campaign,
                session=session,
                say=report.say,
                on_start=report.start,
                on_workers=report.workers,
                on_finding=report.finding,
                on_progress=report.tick,
                on_shrink=report.shrink,
                started=started,  # the budget counts from the command's start: a CI job sees that
            )
        except CampaignError as exc:
            raise UsageError(f"mlafuzz: error: {exc}") from None
        finally:
            report.progress.close()
    summary = result.summary
    for line in console.corpus_result_lines(result.corpus):
        print(line, file=sys.stderr)
    for line in () if args.quiet else console.bundle_lines(summary.bundles):
        print(line)
    for line in console.skip_lines(summary.to_json()):
        print(line, file=sys.stderr)
    print(console.summary_line(summary.to_json()))
    for line in console.verdict_lines(result.judgement, result.found):
        print(line, file=sys.stderr)
    if not result.judgement.passed:
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
