"""Append-only JSONL findings file: one object per line, flushed as each finding happens.

A killed run loses nothing already written: every line is written whole and
flushed (and fsynced) before the fuzz loop moves on; a reader skips a torn last
line instead of failing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from mlafuzz.reports.findings import Finding

FINDINGS_FILE = "findings.jsonl"


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
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


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (a run killed mid-write) is skipped."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_findings(path: Path) -> list[Finding]:
    return [Finding.from_json(r) for r in read_jsonl(path)]
