"""Continuing a run in its own folder (``mlafuzz fuzz --resume``).

Case i is a pure function of the run's seed and i, so a run can go on where it
stopped: the resumed session starts with the cases the last one left in flight
(``unfinished`` in summary.json), then continues the numbering at
``next_case``. Nothing is re-run and every count adds up. That holds only for
the same run: the fields of run.json that decide what case i is (``CASE_KEYS``)
must match, else the resume is refused in one line. A run.json from before ops had shares
(mix.py) gave each op one case per round: it resumes where that is still the mix (one op, or
ops of equal shares) and is refused, saying why, where it is not.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mlafuzz.generators.draw import Knobs
from mlafuzz.reports.findings import Finding, Severity
from mlafuzz.reports.jsonl import FINDINGS_FILE, JsonlError, read_findings
from mlafuzz.reports.model import RUN_FILE, SUMMARY_FILE

# What case i of a run is made of: a resume that changes one of these would continue another run.
CASE_KEYS = (
    "ops",
    "impls",
    "device",
    "seed",
    "shard",
    "ulp",
    "knobs",
    "spec",
    "rejects",
    "features",
    "rerun_every",
    "contract_every",
    "revision",
    "shares",
)


class ResumeError(ValueError):
    """A folder that cannot be resumed; the message is one line."""


@dataclass(frozen=True, kw_only=True)
class Resume:
    """What the earlier sessions of a run left in its folder."""

    summary: Mapping[str, Any]  # their summary.json
    findings: tuple[Finding, ...]  # their findings.jsonl (at most a sample per bucket)

    @property
    def next_case(self) -> int:
        return int(self.summary.get("next_case", 0))

    @property
    def unfinished(self) -> tuple[int, ...]:
        return tuple(int(i) for i in self.summary.get("unfinished") or ())

    @property
    def known_buckets(self) -> frozenset[tuple[str, str, str, str]]:
        """Error buckets found before: not shrunk again (their bundles, if any, are already written)."""
        return frozenset(f.dedup_key for f in self.findings if f.severity is Severity.ERROR)


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ResumeError(f"--resume: {path}: not valid JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise ResumeError(f"--resume: {path}: does not hold a JSON object")
    return data


def _shares(value: Any) -> str:
    return ", ".join(f"{op} {n}" for op, n in value.items()) if isinstance(value, Mapping) else repr(value)


def load_resume(out_dir: Path, run: Mapping[str, Any]) -> Resume:
    """The earlier sessions of the run ``run`` (run.json's dict) in ``out_dir``; ResumeError when
    the folder holds no resumable run or another run (a different seed, op, implementation...)."""
    summary_path, run_path = out_dir / SUMMARY_FILE, out_dir / RUN_FILE
    if not summary_path.is_file() or not run_path.is_file():
        missing = SUMMARY_FILE if not summary_path.is_file() else RUN_FILE
        raise ResumeError(
            f"--resume: {out_dir} has no {missing} (a run killed before it ended, or not a run "
            f"folder): nothing to continue from; use --overwrite to start afresh"
        )
    summary, before = _read(summary_path), _read(run_path)
    if "next_case" not in summary:
        raise ResumeError(
            f"--resume: {summary_path} does not say where the run stopped (written by an older "
            f"mlafuzz); use --overwrite to start afresh"
        )
    mine = _normal(dict(run))
    old = "shares" not in before  # made before ops had shares: every op took one case per round
    if old:
        before = {**before, "shares": dict.fromkeys(before.get("ops") or (), 1)}
    before.setdefault("features", {})  # a run.json from before --features declared none
    if isinstance(before.get("knobs"), dict):  # a run.json from before a knob existed ran under its default
        before = {**before, "knobs": {**dataclasses.asdict(Knobs()), **before["knobs"]}}
    for key in CASE_KEYS:  # "shares" last: a run with other options is told those first
        if _normal(before.get(key)) == mine.get(key):
            continue
        if key == "shares":
            made = "an older mlafuzz, which gave each op the same number of cases" if old else "another mlafuzz"
            raise ResumeError(
                f"--resume: {out_dir} was made by {made}; this one gives the ops shares of the run's time "
                f"({_shares(mine.get(key))}, not {_shares(before.get(key))}): resume it with that mlafuzz, "
                f"or use --overwrite or another --out"
            )
        raise ResumeError(
            f"--resume: {out_dir} holds another run: its {key} is {before.get(key)!r}, this one's "
            f"{mine.get(key)!r}; resume with the same options, or use --overwrite or another --out"
        )
    findings_path = out_dir / FINDINGS_FILE
    try:
        findings = tuple(read_findings(findings_path)) if findings_path.is_file() else ()
    except JsonlError as exc:
        raise ResumeError(f"--resume: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ResumeError(f"--resume: {findings_path} holds a record that is not a finding ({exc})") from None
    return Resume(summary=summary, findings=findings)
