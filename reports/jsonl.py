"""Append-only JSONL findings file: one object per line, flushed as each finding happens.

A killed run loses nothing already written: every line is written whole and
flushed (and fsynced) before the fuzz loop moves on. A run killed mid-write can
leave only its LAST line torn: the reader forgives exactly that line, and a sink
that appends to the file again (``--resume``) first cuts the torn tail off, so it
never ends up in the middle. Any other bad line is corruption, and the reader
stops with a one-line ``JsonlError`` naming the file and the line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from mlafuzz.reports.findings import Finding

FINDINGS_FILE = "findings.jsonl"


class JsonlError(ValueError):
    """A JSONL file with a bad line that is not its last; the message is one line naming file:line."""


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _mend_tail(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, sort_keys=True, allow_nan=False, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def write_findings(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self.write(f.to_json())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _mend_tail(path: Path) -> None:
    """Before appending: end the file with a newline. A tail without one is a write a kill cut
    short; whole JSON gets its newline, a fragment is cut off (it is not a record, and appended
    lines after it would turn the forgivable torn last line into corruption in the middle)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            fh.truncate(start)
        else:
            fh.write(b"\n")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records (JSON objects) of a JSONL file, one per line; blank lines are skipped.

    A bad last line is a run killed mid-write and is skipped; a bad line anywhere else raises
    ``JsonlError`` (file:line and why), so corruption in the middle of a file is never unseen.
    """
    path = Path(path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            bad = None if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"
        except json.JSONDecodeError as exc:
            bad = f"not valid JSON ({exc.msg} at column {exc.colno})"
        if bad is None:
            yield record
        elif number < len(lines):
            raise JsonlError(
                f"{path}:{number}: {bad}; the file is corrupt (only a torn last line, a run killed "
                "mid-write, is forgiven)"
            )


def read_findings(path: Path) -> list[Finding]:
    return [Finding.from_json(r) for r in read_jsonl(path)]
