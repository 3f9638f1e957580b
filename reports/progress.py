"""Live progress for long runs: cases/s, findings by kind, time left, coverage of case features.

A rich live panel on a terminal; plain periodic lines when stderr is a log
file (CI); nothing in quiet mode. It is handed summary.json's dict as the run
goes (the harness's counts) and only shows it.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Mapping

from mlafuzz.reports.console import shrink_line, summary_line

# Features a run should reach; shown as hit counts so gaps stand out.
KEY_FEATURES = (
    "batch:decode-only",
    "batch:prefill-only",
    "batch:mixed",
    "block-boundary",
    "idx:-1",
    "idx:negative",
    "idx:past_table",
    "idx:past_seq_len",
    "values:activations",
    "values:all_codes",
    "values:extreme_scales",
    "values:subnormal",
    "values:nan",
    "empty-request",
    "seq_starts",
    "multi-chunk",
)


class Progress:
    def __init__(self, *, budget: float | None, quiet: bool, interval: float = 10.0) -> None:
        self.budget, self.quiet, self.interval = budget, quiet, interval
        self._live = None
        self._last = time.monotonic()  # first plain line after one interval
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.start()

    def _table(self, s: Mapping[str, Any], elapsed: float):
        from rich.table import Table

        t = Table(title="mlafuzz", show_header=False, expand=False)
        left = f", {max(0.0, self.budget - elapsed):.0f} s left" if self.budget else ""
        t.add_row(
            "cases",
            f"{s.get('cases', 0)} ({s.get('cases_per_second', 0.0):.1f}/s), {s.get('skipped', 0)}"
            f" skipped, {elapsed:.0f} s elapsed{left}",
        )
        kinds = ", ".join(f"{k} {n}" for k, n in sorted((s.get("by_kind") or {}).items())) or "none"
        t.add_row("findings", f"{s.get('findings', 0)} in {s.get('buckets', 0)} buckets: {kinds}")
        coverage = s.get("coverage") or {}
        t.add_row("coverage", "  ".join(f"{f} {coverage.get(f, 0)}" for f in KEY_FEATURES[:8]))
        t.add_row("", "  ".join(f"{f} {coverage.get(f, 0)}" for f in KEY_FEATURES[8:]))
        return t

    def __call__(self, summary: Mapping[str, Any], elapsed: float) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if self._live is not None:
            if now - self._last > 0.25:
                self._last = now
                self._live.update(self._table(summary, elapsed))
            return
        if now - self._last > self.interval:
            self._last = now
            print(f"  ... {summary_line(summary)}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class ShrinkProgress:
    """Lines for shrinking: each bucket's start and end, and a progress line every ``interval``
    seconds while one goes on (an attempt of a slow case can take seconds)."""

    def __init__(self, *, quiet: bool, interval: float = 5.0) -> None:
        self.quiet, self.interval = quiet, interval
        self._last = time.monotonic()

    def __call__(self, event: str, facts: Mapping[str, Any]) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if event == "step" and now - self._last < self.interval:
            return
        self._last = now
        print(shrink_line(event, facts), file=sys.stderr, flush=True)
