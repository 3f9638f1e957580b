"""``render(run_dir, fmt)``: one run directory, one report format, chosen from the FORMATS registry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mlafuzz.reports.html import render_html
from mlafuzz.reports.json_summary import render_json
from mlafuzz.reports.junit import render_junit
from mlafuzz.reports.markdown import render_markdown
from mlafuzz.reports.model import ReportError, RunReport, load_run

if TYPE_CHECKING:
    from mlafuzz.harness.ledger import Ledger

Renderer = Callable[[RunReport], str]

FORMATS: dict[str, Renderer] = {
    "junit": render_junit,
    "md": render_markdown,
    "html": render_html,
    "json": render_json,
}

# The file suffix each format is usually saved under (for -o defaults and docs).
SUFFIXES: dict[str, str] = {"junit": ".xml", "md": ".md", "html": ".html", "json": ".json"}


def render(run_dir: Path, fmt: str, *, ledger: "Ledger | None" = None) -> str:
    """The report of ``run_dir`` in format ``fmt`` (a key of FORMATS); ReportError on a bad dir or format."""
    renderer = FORMATS.get(fmt)
    if renderer is None:
        raise ReportError(f"fmt={fmt!r} must be one of: {', '.join(FORMATS)}")
    return renderer(load_run(run_dir, ledger=ledger))
