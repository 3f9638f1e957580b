"""What ``mlafuzz fuzz`` decides for the user before a case runs: the run seed (a fresh one
unless told), the header's word on a default that stands in for a missing one, the corpus to
replay first, and when to stop early (--max-findings)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
from pathlib import Path
from typing import Any

from mlafuzz.harness.cli.args import UsageError, nonneg_int
from mlafuzz.reports.console import plural

SEED_ENV = "MLAFUZZ_SEED"  # the run seed when --seed is not given (a job that wants fixed cases)


def run_seed(args: argparse.Namespace, out: Path, used: bool) -> tuple[int, bool]:
    """(the run's seed, whether it was drawn fresh). --seed wins; --resume goes on with the seed its
    run.json recorded; then $MLAFUZZ_SEED; else a fresh one, so each plain run explores new cases
    (the header prints it, run.json records it: a rerun is one --seed away)."""
    if args.seed is not None:
        return args.seed, False
    if args.resume and used:
        try:
            recorded = json.loads((out / "run.json").read_text(encoding="utf-8")).get("seed")
        except (OSError, ValueError, AttributeError):
            recorded = None  # load_resume says what is wrong with the folder
        if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 0:
            return recorded, False
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        try:
            return nonneg_int(text), False
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"mlafuzz: ${SEED_ENV}={text!r}: {exc}") from None
    return secrets.randbelow(2**32), True


def default_notes(session: Any, refs: dict[str, str], texts: list[str] | None, device: str) -> list[str]:
    """A line per op whose default implementation is not its first choice here (our Triton
    convert without Triton: the torch one stands in), so the header says what ran and why."""
    named = {t.partition("=")[0] for t in texts or ()}
    notes = []
    for op, ref in refs.items():
        first = next(iter(session.table.get(op).defaults.get(device.split(":")[0], ())), ref)
        if op in named or first == ref:
            continue
        entry = session.registry.get(op, first)
        missing = entry.missing() if entry is not None else ()
        why = f"{', '.join(missing)} not installed" if missing else f"{first} cannot run on {device}"
        notes.append(f"{op}={ref}: {why}, so not {op}={first}")
    return notes


def read_corpus(args: argparse.Namespace, config: Any) -> tuple[list, list[str]]:
    """--corpus DIR: its bundles as the run's first tasks (drive/replay.py ``corpus_tasks``), read
    before the run folder is cleared (the corpus may be the last run's own bundles), and the lines
    to print: one per bundle left out, one saying how many run first."""
    from mlafuzz.harness.drive.replay import corpus_tasks
    from mlafuzz.reports.bundle import BundleError

    try:
        tasks, notes = corpus_tasks(
            Path(args.corpus),
            impls=config.impls,
            device=config.device,
            ulp=config.policy.ulp,
            revision=config.revision,
            rejects=config.rejects,
            shard=(config.shard.index, config.shard.count),
        )
    except BundleError as exc:
        raise UsageError(f"mlafuzz: --corpus {args.corpus}: {exc}") from None
    lines = [f"mlafuzz: --corpus: {note}" for note in notes]
    mine = f" (shard {config.shard.index}/{config.shard.count}'s share)" if config.shard.count > 1 else ""
    lines.append(f"mlafuzz: replaying {plural(len(tasks), 'corpus bundle')} from {args.corpus}{mine} first")
    return tasks, lines


def stop_after(max_findings: int | None):
    """fuzz()'s ``stop_when`` for --max-findings: N error buckets, this session's and a resumed
    run's earlier ones together."""
    if max_findings is None:
        return None
    return lambda summary: len(set(summary.buckets) | summary.known) >= max_findings
