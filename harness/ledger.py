"""The expected-failures ledger, and the one verdict (``judge``) every edge uses.

``judge`` decides, for the CLI's exit code, the pytest plugin's items and every
report format alike, which finding buckets fail: an error-severity bucket no
ledger entry waives. Reports only render its ``Judgement``.

A ledger holds known finding buckets that do not fail a run.

A ledger is a file in the user's repository, TOML (``[[expected]]`` tables) or
JSON (``{"expected": [...]}`` or a bare list). Each entry names one finding
bucket -- ``kind``, ``op``, ``impl`` and ``cause`` (``"*"`` matches any cause)
-- and must cite why it is waived: ``issue`` or ``link``. Every mistake in the
file is one ``LedgerError`` line naming the file and the entry.

    [[expected]]
    kind = "VALUE_MISMATCH"
    op = "gather"
    impl = "vllm"
    cause = "*"
    issue = "https://github.com/vllm-project/vllm/pull/48642"
    note = "pre-#48642 gather reads every request from position 0"

Entries that matched nothing are *stale*: reported so they can be removed
once the bug is fixed. An entry for an implementation the run did not fuzz is
*not applicable* to that run: listed apart, since a shared ledger names other
jobs' implementations (and a misspelt impl never matches anything).

A run records its ledger's entries in run.json (``ledger_record``): the CI job
that merges and reports shards may not have the file, and ``report`` applies
the recorded entries unless told another ledger (``ledger_from_record``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from mlafuzz.reports.findings import Finding, Kind, Severity
from mlafuzz.reports.model import WILDCARD, Judgement, Waiver

try:
    import tomllib
except ImportError:  # Python 3.10: JSON ledgers only
    tomllib = None  # type: ignore[assignment]

_PARSE_ERRORS: tuple[type[Exception], ...] = (json.JSONDecodeError,) + ((tomllib.TOMLDecodeError,) if tomllib else ())
_REQUIRED = ("kind", "op", "impl", "cause")
_REFS = ("issue", "link")
_KNOWN = frozenset(_REQUIRED + _REFS + ("note",))


class LedgerError(ValueError):
    """A malformed ledger; the message is one line naming the file and the entry."""


@dataclass(frozen=True, kw_only=True)
class Ledger:
    path: Path
    entries: tuple[Waiver, ...]

    def match(self, finding: Finding) -> Waiver | None:
        """The entry that waives ``finding``: an exact cause wins over a ``*`` one."""
        hits = [e for e in self.entries if e.matches(finding)]
        hits.sort(key=lambda e: e.cause == WILDCARD)
        return hits[0] if hits else None

    def stale(self, findings: Iterable[Finding], *, ran: Iterable[tuple[str, str]] | None = None) -> list[Waiver]:
        """Entries that matched none of ``findings``.

        ``ran``, the (op, impl) pairs that were actually fuzzed, limits the
        answer to entries that had a chance to match: an entry for an impl not
        run this time is not stale (``not_applicable`` lists it).
        """
        matched = {id(e) for f in findings for e in self.entries if e.matches(f)}
        pairs = None if ran is None else set(ran)
        return [e for e in self.entries if id(e) not in matched and (pairs is None or (e.op, e.impl) in pairs)]

    def not_applicable(self, ran: Iterable[tuple[str, str]] | None) -> list[Waiver]:
        """Entries for an (op, impl) the run did not fuzz: they could not match, stale or not."""
        if ran is None:
            return []
        pairs = set(ran)
        return [e for e in self.entries if (e.op, e.impl) not in pairs]


def judge(
    findings: Iterable[Finding], *, ledger: Ledger | None = None, ran: Iterable[tuple[str, str]] | None = None
) -> Judgement:
    """The verdict: each finding bucket (``Finding.dedup_key``) is "failure" (an error no ledger
    entry waives), "expected" (waived) or "info" (only INFO findings: never fails); the run passed
    when no bucket failed. ``ran``: the (op, impl) pairs fuzzed, for the stale entries."""
    found = list(findings)
    groups: dict[tuple[str, str, str, str], list[Finding]] = {}
    for f in found:
        groups.setdefault(f.dedup_key, []).append(f)
    statuses: dict[tuple[str, str, str, str], str] = {}
    waivers: dict[tuple[str, str, str, str], Waiver] = {}
    for key, members in groups.items():
        if not any(f.severity is Severity.ERROR for f in members):
            statuses[key] = "info"
            continue
        entry = next((e for e in map(ledger.match, members) if e is not None), None) if ledger else None
        if entry is not None:
            waivers[key] = entry
        statuses[key] = "expected" if entry is not None else "failure"
    ran = None if ran is None else list(ran)
    stale = tuple(ledger.stale(found, ran=ran)) if ledger else ()
    elsewhere = tuple(ledger.not_applicable(ran)) if ledger else ()
    matched = tuple(sorted({e.index for f in found for e in ledger.entries if e.matches(f)})) if ledger else ()
    return Judgement(
        statuses=statuses,
        waivers=waivers,
        stale=stale,
        not_applicable=elsewhere,
        matched=matched,
        ledger=str(ledger.path) if ledger else None,
    )


# --- loading ----------------------------------------------------------------


def _parse(path: Path, text: str) -> Any:
    as_json = path.suffix.lower() == ".json" or (path.suffix.lower() != ".toml" and text.lstrip()[:1] in "[{")
    if not as_json and tomllib is None:
        raise LedgerError(f"ledger={path}: TOML ledgers need Python >= 3.11 (tomllib); use a .json ledger")
    try:
        return json.loads(text) if as_json else tomllib.loads(text)
    except _PARSE_ERRORS as exc:
        detail = " ".join(str(exc).split())
        raise LedgerError(f"ledger={path}: not valid {'JSON' if as_json else 'TOML'}: {detail}") from None


def _entry(path: Path, index: int, raw: Any) -> Waiver:
    where = f"ledger={path}: expected[{index}]"
    if not isinstance(raw, dict):
        raise LedgerError(f"{where} must be a table/object, got {type(raw).__name__}")
    shown = " ".join(f"{k}={raw[k]!r}" for k in _REQUIRED if k in raw)
    where = f"{where} ({shown})" if shown else where
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise LedgerError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})")
    for key in _REQUIRED:
        if key not in raw:
            raise LedgerError(
                f"{where}: {key}= is required ({key}='*' is allowed for cause only)"
                if key == "cause"
                else f"{where}: {key}= is required"
            )
    for key in _KNOWN & set(raw):
        if not isinstance(raw[key], str) or (key != "note" and not raw[key].strip()):
            raise LedgerError(f"{where}: {key}={raw[key]!r} must be a non-empty string")
    refs = [raw[k].strip() for k in _REFS if k in raw]
    if not refs:
        raise LedgerError(f"{where}: issue= (or link=) is required: every expected failure cites an issue or link")
    if raw["kind"] not in Kind.__members__:
        raise LedgerError(f"{where}: kind={raw['kind']!r} is not a finding kind (one of {', '.join(Kind.__members__)})")
    for key in ("kind", "op", "impl"):
        if raw[key] == WILDCARD:
            raise LedgerError(f"{where}: {key}='*' is not allowed (only cause may be '*')")
    return Waiver(
        kind=raw["kind"],
        op=raw["op"],
        impl=raw["impl"],
        cause=raw["cause"],
        issue=refs[0],
        note=raw.get("note", ""),
        index=index,
        ledger=str(path),
    )


def _entries(path: Path, raw_entries: Any) -> Ledger:
    """The ledger of ``raw_entries`` (a file's, or one a run recorded), every entry checked."""
    if not isinstance(raw_entries, list):
        raise LedgerError(f"ledger={path}: expected a top-level 'expected' array of entries")
    entries = tuple(_entry(path, i, raw) for i, raw in enumerate(raw_entries))
    seen: dict[tuple[str, str, str, str], int] = {}
    for e in entries:
        key = (e.kind, e.op, e.impl, e.cause)
        if key in seen:
            raise LedgerError(f"ledger={path}: {e.label()} duplicates expected[{seen[key]}]")
        seen[key] = e.index
    return Ledger(path=path, entries=entries)


def ledger_record(ledger: Ledger | None) -> dict[str, Any] | None:
    """What run.json keeps of the run's ledger: its file's name and every entry (the content, so
    that a report or merge elsewhere applies the same waivers); None without a ledger."""
    if ledger is None:
        return None
    keep = ("kind", "op", "impl", "cause", "issue", "note")
    return {"file": str(ledger.path), "expected": [{k: e.to_json()[k] for k in keep} for e in ledger.entries]}


def ledger_from_record(record: Any, *, where: str) -> Ledger | None:
    """The ledger a run recorded (``ledger_record``), checked as a file is; None when it had none.
    ``where`` names the run.json in messages."""
    if record is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("file"), str):
        raise LedgerError(f"ledger recorded in {where}: not a ledger record (file=, expected=)")
    return _entries(Path(record["file"]), record.get("expected"))


def ledger_of_run(run: Any, *, where: str, override: Path | str | None = None) -> Ledger | None:
    """The ledger that judges a run folder: ``override`` (a file) when given, else the one the run
    recorded in its run.json ``run`` (``where`` names it in messages), else none."""
    if override:
        return load_ledger(override)
    return ledger_from_record(run.get("ledger") if isinstance(run, dict) else None, where=where)


def load_ledger(path: Path | str) -> Ledger:
    """Read and validate a ledger; every problem is a one-line LedgerError."""
    path = Path(path)
    if not path.is_file():
        raise LedgerError(f"ledger={path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LedgerError(f"ledger={path}: cannot read: {exc}") from None
    data = _parse(path, text)
    raw_entries = data.get("expected", None) if isinstance(data, dict) else data
    if isinstance(data, dict) and set(data) - {"expected"}:
        raise LedgerError(
            f"ledger={path}: unknown top-level key {sorted(set(data) - {'expected'})[0]!r}"
            " (the file holds one 'expected' array of entries)"
        )
    return _entries(path, raw_entries)
