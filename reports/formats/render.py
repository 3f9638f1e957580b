"""``render(report, fmt)``: one judged run, one report format, chosen from the FORMATS table."""

from __future__ import annotations

from typing import Callable

from mlafuzz.reports.formats.html import render_html
from mlafuzz.reports.formats.json_summary import render_json
from mlafuzz.reports.formats.junit import render_junit
from mlafuzz.reports.formats.markdown import render_markdown
from mlafuzz.reports.model import ReportError, RunReport

Renderer = Callable[[RunReport], str]

FORMATS: dict[str, Renderer] = {
    "junit": render_junit,
    "md": render_markdown,
    "html": render_html,
    "json": render_json,
}

# The file suffix each format is usually saved under (for -o defaults and docs).
SUFFIXES: dict[str, str] = {"junit": ".xml", "md": ".md", "html": ".html", "json": ".json"}


def render(report: RunReport, fmt: str) -> str:
    """``report`` (reports/model.py ``build_report``) in format ``fmt`` (a key of FORMATS);
    ReportError on an unknown format."""
    renderer = FORMATS.get(fmt)
    if renderer is None:
        raise ReportError(f"fmt={fmt!r} must be one of: {', '.join(FORMATS)}")
    return renderer(report)
