"""The ``report`` and ``merge`` subcommands.

``report`` judges a run folder under the ledger the run recorded in run.json (``--ledger FILE``
instead, to judge it under another) and writes the report. Its exit status is the verdict, so a
CI step can rest on it: 0 passed, 1 failed or not a whole run (stopped, killed, shards missing:
the report is written all the same), 2 one line on a bad directory, format, ledger or output.
``merge`` exits 0 when it wrote the merge, whole or not (a warning line per shard missing, killed
or stopped; summary.json says ``partial``, ``missing_shards``, ``interrupted``), so that
``merge && report`` always writes the report, whose exit fails such a merge; 2 with one line when
it refuses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlafuzz.harness.cli.args import EXIT_FINDINGS, EXIT_OK, UsageError
from mlafuzz.reports.atomic import atomic_write
from mlafuzz.reports.formats.render import FORMATS

EXIT_INCOMPLETE = EXIT_FINDINGS  # a partial merge, a stopped run: never read as a pass


def _usage(message: str) -> Exception:
    return UsageError(message)


def cmd_report(args: argparse.Namespace) -> int:
    from mlafuzz.harness.ledger import LedgerError, judge, ledger_of_run
    from mlafuzz.reports.formats.render import render
    from mlafuzz.reports.model import RUN_FILE, ReportError, build_report, load_run

    try:
        view = load_run(Path(args.run_dir))
        # the run's own unless told another: its shards were judged by it, and a merge job may lack the file
        ledger = ledger_of_run(dict(view.run), where=str(Path(args.run_dir) / RUN_FILE), override=args.ledger)
        judgement = judge(view.findings, ledger=ledger, ran=view.pairs())
        report = build_report(view, judgement)
        text = render(report, args.format)
    except (ReportError, LedgerError) as exc:
        raise _usage(f"mlafuzz report: {exc}") from None
    status = EXIT_OK if report.status == "passed" else EXIT_INCOMPLETE
    if args.output in (None, "-"):
        sys.stdout.write(text)
        return status
    output = Path(args.output)
    if output.is_dir():
        raise _usage(f"mlafuzz report: -o {args.output}: is a folder; name the file to write")
    if not output.parent.is_dir():  # a mistyped path is refused, never created
        raise _usage(f"mlafuzz report: -o {args.output}: folder {output.parent} does not exist")
    try:
        atomic_write(output, text)
    except OSError as exc:
        raise _usage(f"mlafuzz report: -o {args.output}: cannot write: {exc.strerror or exc}") from None
    print(f"mlafuzz: {args.format} report of {args.run_dir} -> {args.output}: {report.status}", file=sys.stderr)
    return status


def cmd_merge(args: argparse.Namespace) -> int:
    from mlafuzz.reports.merge import merge_runs
    from mlafuzz.reports.model import ReportError

    try:
        result = merge_runs([Path(d) for d in args.run_dirs], Path(args.out), overwrite=args.overwrite)
    except ReportError as exc:
        raise _usage(f"mlafuzz {exc}") from None
    except OSError as exc:
        raise _usage(f"mlafuzz merge: --out {args.out}: cannot write: {exc.strerror or exc}") from None
    from mlafuzz.reports.console import merge_lines, merge_warnings

    for line in merge_lines(result):
        print(line)
    for line in merge_warnings(result):
        print(line, file=sys.stderr)
    return EXIT_OK  # written, partial or not: `report` of it gives the verdict (a partial merge fails it)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add ``report`` and ``merge`` to the ``mlafuzz`` subcommands."""
    r = subparsers.add_parser(
        "report",
        help="render a run directory as JUnit XML, Markdown, HTML or JSON",
        description="Render a run directory (findings.jsonl, summary.json) as a report. JUnit: a testcase per op "
        "and implementation, a failure per failing finding bucket. md suits a CI step summary: "
        'mlafuzz report DIR --format md >> "$GITHUB_STEP_SUMMARY". The ledger the run recorded in run.json '
        "judges it. Exit 0 passed, 1 failed or incomplete (stopped, killed, shards missing; the report is still "
        "written), 2 on a bad directory.",
    )
    r.add_argument("run_dir", metavar="DIR", help="run directory (a fuzz --out, or a merge --out)")
    r.add_argument("--format", choices=tuple(FORMATS), default="md", help="report format (default md)")
    r.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    r.add_argument(
        "--ledger",
        metavar="FILE",
        help="expected-failures ledger (TOML or JSON): waived buckets are shown, not failed (default: the one the"
        " run recorded in run.json)",
    )
    r.set_defaults(func=cmd_report)

    m = subparsers.add_parser(
        "merge",
        help="merge shard run directories into one",
        description="Concatenate the findings of the shard run directories of one run (each line keeps its "
        "shard), sum their summary counts, and write OUT/findings.jsonl and OUT/summary.json. Shards with "
        "different seeds, K/N schemes, implementations or ledgers are refused; a directory that repeats another's "
        "cases (same seed, shard, ops and implementations) is dropped, with a line saying so. A shard of the K/N "
        "scheme missing, killed or stopped is a warning line, and report of the merge exits 1. Exit 0 when "
        "written, 2 when refused.",
    )
    m.add_argument("run_dirs", nargs="+", metavar="DIR", help="shard run directories")
    m.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="merged run directory (created; the shards' repro bundles are copied into DIR/bundles); one "
        "that holds an earlier run is refused unless --overwrite",
    )
    m.add_argument(
        "--overwrite",
        action="store_true",
        help="--out holds an earlier run: remove its files (findings, summary, bundles) first",
    )
    m.set_defaults(func=cmd_merge)
