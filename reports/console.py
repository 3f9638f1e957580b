"""Rich console rendering of findings for the CLI: one row per bucket, failures first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlafuzz.harness.findings import Finding
from mlafuzz.reports.model import group_buckets, replay_command
from mlafuzz.reports.text import one_line

if TYPE_CHECKING:
    from mlafuzz.harness.ledger import Ledger

_STYLE = {"failure": "bold red", "expected": "yellow", "info": "cyan"}


def print_findings_table(findings: Iterable[Finding], console: Console, *, ledger: "Ledger | None" = None,
                         max_rows: int = 30, replay: bool = True, bundles: list | None = None) -> int:
    """Print a findings table (a row per dedup bucket); returns the number of failing buckets.

    ``bundles`` is FuzzSummary.bundles (or summary.json's): their replay commands are printed per bucket.
    """
    buckets = group_buckets(findings, ledger)
    if not buckets:
        console.print(Text("mlafuzz: no findings", style="green"))
        return 0
    table = Table(title=f"mlafuzz findings: {len(buckets)} bucket(s)", title_justify="left", show_lines=False)
    for name, kw in (("status", {}), ("kind", {}), ("op", {}), ("impl", {"overflow": "fold", "max_width": 40}),
                     ("cause", {}), ("n", {"justify": "right"}), ("first message", {"overflow": "fold"})):
        table.add_column(name, **kw)
    for b in buckets[:max_rows]:
        table.add_row(Text(b.status, style=_STYLE[b.status]), b.kind, b.op, b.impl, b.cause or "-",
                      str(len(b.findings)), Text(one_line(b.first.message, 160)))
    console.print(table)
    if len(buckets) > max_rows:
        console.print(f"... {len(buckets) - max_rows} more bucket(s)")
    if replay:
        for b in buckets[:max_rows]:
            cmd = replay_command(b.first, bundles=bundles)
            if cmd and b.is_failure:
                console.print(Text(f"replay {b.kind} {b.op} {b.cause}: ", style="dim") + Text(cmd))
    return sum(1 for b in buckets if b.is_failure)
