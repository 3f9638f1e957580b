"""What ``mlafuzz fuzz`` decides for the user before a case runs: the run seed (a fresh one
unless told), the header's word on a default that stands in for a missing one, and the lines
about the corpus replayed first."""

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


def corpus_lines(prepared: Any, corpus: str) -> list[str]:
    """--corpus DIR's lines: one per bundle left out, one saying how many run first."""
    config = prepared.config
    lines = [f"mlafuzz: --corpus: {note}" for note in prepared.corpus_notes]
    mine = f" (shard {config.shard.index}/{config.shard.count}'s share)" if config.shard.count > 1 else ""
    lines.append(f"mlafuzz: replaying {plural(len(prepared.corpus), 'corpus bundle')} from {corpus}{mine} first")
    return lines
