"""A run directory read into one view that every report format renders.

A run directory holds ``findings.jsonl`` (one finding per line, appended as
found) and ``summary.json``; later also ``run.json`` (the config) and
``bundles/``. Any of them may be missing (a killed run has no summary): the
view says what it could read and never guesses what the files don't support.
Buckets group findings by ``Finding.dedup_key``. Which buckets fail is not
decided here: the harness's verdict (harness/ledger.py ``judge``) hands its
``Judgement`` in, and every format renders that.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from mlafuzz.reports.findings import Finding, Severity
from mlafuzz.reports.invocation import command
from mlafuzz.reports.jsonl import FINDINGS_FILE, JsonlError, read_findings

BucketKey = tuple[str, str, str, str]  # Finding.dedup_key: kind, op, impl, cause

SUMMARY_FILE = "summary.json"
BUCKET_SEP = "\x1f"  # summary.json's bucket_counts key: the dedup key joined by it
RUN_FILE = "run.json"
UNKNOWN_IMPL = "?"


class ReportError(ValueError):
    """A run directory that cannot be reported on; the message is one line."""


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 bucket', '2 buckets' (``words`` for an irregular plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def bucket_counts(summary: Mapping[str, Any]) -> dict[BucketKey, int]:
    """summary.json's ``bucket_counts``: every bucket's number of findings (findings.jsonl keeps at
    most a sample of a bucket's lines); {} when the summary has none."""
    raw = summary.get("bucket_counts") if isinstance(summary, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    out: dict[BucketKey, int] = {}
    for key, n in raw.items():
        parts = str(key).split(BUCKET_SEP)
        if len(parts) == 4 and isinstance(n, int) and not isinstance(n, bool):
            out[(parts[0], parts[1], parts[2], parts[3])] = n
    return out


WILDCARD = "*"  # a ledger entry's cause that matches any cause
# Why a ledger entry is neither matched nor stale: a shared ledger names other jobs' implementations.
NOT_APPLICABLE = (
    "not applicable to this run: it did not fuzz this op with this implementation (another job's, or a misspelt name)"
)


@dataclass(frozen=True, kw_only=True)
class Waiver:
    """One entry of an expected-failures ledger: the bucket it waives and the issue that says why.

    The ledger (harness/ledger.py) loads its entries as these, ``judge`` hands the ones that
    matched (and the stale ones, that matched nothing) to the reports: one record for both."""

    index: int  # position in the ledger file, for messages
    kind: str
    op: str
    impl: str
    cause: str  # WILDCARD matches any cause
    issue: str  # the issue or link that justifies the waiver
    note: str = ""
    ledger: str = ""  # the ledger file it came from

    def matches(self, finding: Finding) -> bool:
        kind, op, impl, cause = finding.dedup_key
        return (self.kind, self.op, self.impl) == (kind, op, impl) and self.cause in (WILDCARD, cause)

    def label(self) -> str:
        return f"expected[{self.index}] {self.kind} {self.op}={self.impl} cause={self.cause}"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "op": self.op,
            "impl": self.impl,
            "cause": self.cause,
            "issue": self.issue,
            "note": self.note,
        }


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """The harness's verdict on a run's findings (harness/ledger.py ``judge`` makes it): each
    bucket's status ("failure", "expected", "info"), the waivers, the stale ledger entries."""

    statuses: Mapping[BucketKey, str] = field(default_factory=dict)
    waivers: Mapping[BucketKey, Waiver] = field(default_factory=dict)
    stale: tuple[Waiver, ...] = ()
    not_applicable: tuple[Waiver, ...] = ()  # entries for an (op, impl) the run did not fuzz
    matched: tuple[int, ...] = ()  # indices of the ledger entries some finding matched
    ledger: str | None = None

    @property
    def passed(self) -> bool:
        return "failure" not in self.statuses.values()

    def failing(self) -> list[BucketKey]:
        return [k for k, v in self.statuses.items() if v == "failure"]


@dataclass(frozen=True, kw_only=True)
class Bucket:
    key: BucketKey
    findings: tuple[Finding, ...]  # the lines findings.jsonl holds (a sample when the bucket is large)
    status: str  # the judgement's: failure | expected | info
    waiver: Waiver | None = None
    total: int = 0  # summary.json's count of the bucket's findings, 0 when it has none

    @property
    def count(self) -> int:
        """The bucket's number of findings: the run's count, never fewer than the lines read."""
        return max(self.total, len(self.findings))

    kind = property(lambda self: self.key[0])
    op = property(lambda self: self.key[1])
    impl = property(lambda self: self.key[2])
    cause = property(lambda self: self.key[3])

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def severity(self) -> Severity:
        return Severity.ERROR if any(f.severity is Severity.ERROR for f in self.findings) else Severity.INFO

    @property
    def is_failure(self) -> bool:
        return self.status == "failure"

    @property
    def slug(self) -> str:
        """A stable, HTML-id-safe name for the bucket (anchors, file names)."""
        digest = hashlib.sha1("\x1f".join(self.key).encode()).hexdigest()[:10]
        return f"{self.kind.lower()}-{''.join(c if c.isalnum() else '-' for c in self.op)}-{digest}"

    @property
    def max_ulp(self) -> int | None:
        ulps = [f.max_ulp for f in self.findings if f.max_ulp is not None]
        return max(ulps) if ulps else None

    def title(self) -> str:
        return f"{self.kind} {self.op}={self.impl} cause={self.cause or '-'}"


@dataclass(frozen=True, kw_only=True)
class TestCase:
    """One op under one implementation: a JUnit testcase, a row of the implementations table."""

    __test__ = False  # not a pytest class
    op: str
    impl: str
    buckets: tuple[Bucket, ...] = ()
    cases: int | None = None
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.op}[{self.impl}]"

    @property
    def failures(self) -> tuple[Bucket, ...]:
        return tuple(b for b in self.buckets if b.is_failure)

    @property
    def status(self) -> str:
        return "failed" if self.failures else "passed"


@dataclass(frozen=True, kw_only=True)
class RunReport:
    run_dir: Path
    findings: tuple[Finding, ...]
    buckets: tuple[Bucket, ...]
    testcases: tuple[TestCase, ...]
    summary: Mapping[str, Any] = field(default_factory=dict)  # summary.json, {} when missing
    run: Mapping[str, Any] = field(default_factory=dict)  # run.json, {} when missing
    stale: tuple[Waiver, ...] = ()
    not_applicable: tuple[Waiver, ...] = ()  # ledger entries for an (op, impl) this run did not fuzz
    ledger: str | None = None  # the ledger that judged it (its file's name), None without one
    notes: tuple[str, ...] = ()  # what could not be read, said once

    @property
    def failures(self) -> tuple[Bucket, ...]:
        return tuple(b for b in self.buckets if b.is_failure)

    @property
    def passed(self) -> bool:
        return not self.failures

    def count(self, status: str) -> int:
        """Findings in buckets of ``status`` (each bucket's ``count``: the run's, not the sample's)."""
        return sum(b.count for b in self.buckets if b.status == status)

    def buckets_with(self, status: str) -> tuple[Bucket, ...]:
        return tuple(b for b in self.buckets if b.status == status)

    def replay(self, finding: Finding) -> str | None:
        """The replay command for ``finding`` (see ``replay_command``), using this run's bundles and config."""
        return replay_command(finding, self.run, bundles=self.summary.get("bundles"))

    def bundle_for(self, bucket: Bucket) -> Mapping[str, Any] | None:
        """summary.json's bundle entry for ``bucket`` (path, replay, minimized size), if it was bundled."""
        for b in self.summary.get("bundles") or ():
            if isinstance(b, Mapping) and tuple(b.get("bucket") or ()) == bucket.key:
                return b
        return None

    @property
    def shards(self) -> list[Mapping[str, Any]]:
        shards = self.summary.get("shards")
        return list(shards) if isinstance(shards, list) else []

    @property
    def stopped(self) -> bool:
        """Ctrl-C or SIGTERM (CI's cancel) ended the run, or a shard of it, before its end."""
        return bool(self.summary.get("interrupted"))

    @property
    def incomplete(self) -> str | None:
        """Why the run's counts are not the whole run's (a run killed before it wrote summary.json,
        a merge without some shards, a stopped run); None for a run that finished."""
        if not self.summary:
            return f"no {SUMMARY_FILE}: the run was killed or is still running"
        missing = self.summary.get("missing_shards")
        if missing:
            return f"shard {', '.join(map(str, missing))} missing from the merge"
        if self.summary.get("partial"):
            return f"a shard has no {SUMMARY_FILE}: it was killed or is still running"
        if self.stopped:
            told = self.summary.get("terminated")  # absent from older summaries: not known which
            by = "SIGTERM" if told else "Ctrl-C" if told is False else "Ctrl-C or SIGTERM"
            return f"stopped by {by} after {plural(int(self.summary.get('cases') or 0), 'case')}"
        return None

    @property
    def status(self) -> str:
        """failed (a failing bucket), stopped, incomplete (killed, shards missing) or passed."""
        if not self.passed:
            return "failed"
        return "stopped" if self.stopped else "incomplete" if self.incomplete else "passed"

    @property
    def tests(self) -> int:
        """JUnit's testcases: one per failing bucket, one per implementation without any, and one
        saying the run is incomplete when it is."""
        return sum(max(1, len(t.failures)) for t in self.testcases) + (1 if self.incomplete else 0)

    def headline(self) -> str:
        cases = self.summary.get("cases")
        ran = plural(cases, "case") if isinstance(cases, int) else "cases unknown"
        if self.incomplete:
            found = (
                f"{plural(len(self.failures), 'failing bucket')} ({plural(self.count('failure'), 'finding')}) so far"
                if self.failures
                else "no failing finding in what it wrote"
            )
            return f"mlafuzz: {'stopped' if self.stopped else 'incomplete'} run ({self.incomplete}): {found}"
        if self.passed:
            extra = [
                plural(len(self.buckets_with(s)), f"{s} bucket") for s in ("expected", "info") if self.buckets_with(s)
            ]
            return f"mlafuzz: passed, {ran}" + (f" ({', '.join(extra)})" if extra else "")
        return (
            f"mlafuzz: {plural(len(self.failures), 'failing bucket')} ({plural(self.count('failure'), 'finding')})"
            f" in {sum(1 for t in self.testcases if t.failures)} of"
            f" {plural(len(self.testcases), 'implementation')}, {ran}"
        )


# --- reading ----------------------------------------------------------------


def _read_json(path: Path, notes: list[str]) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name} unreadable ({' '.join(str(exc).split())}); ignored")
        return {}
    if not isinstance(data, dict):
        notes.append(f"{path.name} does not hold a JSON object; ignored")
        return {}
    return data


def configured_impls(run: Mapping[str, Any]) -> dict[str, str]:
    """op -> impl name from run.json's ``impls``: a mapping (to a name or {"name": ...}) or "op=ref" strings."""
    raw = run.get("impls")
    out: dict[str, str] = {}
    if isinstance(raw, Mapping):
        for op, v in raw.items():
            name = v.get("name") if isinstance(v, Mapping) else v
            if isinstance(name, str):
                out[str(op)] = name
    elif isinstance(raw, list):
        for text in raw:
            op, sep, ref = str(text).partition("=")
            if sep:
                out[op] = ref
    return out


def group_buckets(
    findings: Iterable[Finding], judgement: Judgement, counts: Mapping[BucketKey, int] | None = None
) -> tuple[Bucket, ...]:
    """Findings grouped by dedup key, in order of first appearance, with the judgement's status
    and ``counts`` (``bucket_counts``); failures first, then expected, then info."""
    counts = counts or {}
    groups: dict[BucketKey, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.dedup_key, []).append(f)
    buckets = []
    for key, members in groups.items():
        default = "failure" if any(f.severity is Severity.ERROR for f in members) else "info"
        buckets.append(
            Bucket(
                key=key,
                findings=tuple(members),
                status=judgement.statuses.get(key, default),
                waiver=judgement.waivers.get(key),
                total=counts.get(key, 0),
            )
        )
    order = {"failure": 0, "expected": 1, "info": 2}
    return tuple(sorted(buckets, key=lambda b: order[b.status]))


def impls_from_findings(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """op -> impl where the findings name exactly one impl for the op (one run fuzzes one impl per op)."""
    seen: dict[str, set[str]] = {}
    for op, impl in pairs:
        seen.setdefault(op, set()).add(impl)
    return {op: next(iter(impls)) for op, impls in seen.items() if len(impls) == 1}


def _int_counts(value: Any) -> dict[str, int]:
    return {str(k): v for k, v in value.items() if isinstance(v, int)} if isinstance(value, Mapping) else {}


def _case_counts(
    buckets: tuple[Bucket, ...], summary: Mapping[str, Any], run: Mapping[str, Any]
) -> dict[tuple[str, str], int]:
    """(op, impl) -> cases run: per shard for a merged run, else the run's per_op under its impls."""
    shards = [s for s in summary.get("shards") or () if isinstance(s, Mapping)]
    parts = [(configured_impls(s), _int_counts(s.get("per_op"))) for s in shards] or [
        (
            configured_impls(run) or impls_from_findings((b.op, b.impl) for b in buckets),
            _int_counts(summary.get("per_op")),
        )
    ]
    counts: dict[tuple[str, str], int] = {}
    for impls, per_op in parts:
        for op, n in per_op.items():
            key = (op, impls.get(op, UNKNOWN_IMPL))
            counts[key] = counts.get(key, 0) + n
    return counts


def _testcases(buckets: tuple[Bucket, ...], summary: Mapping[str, Any], run: Mapping[str, Any]) -> tuple[TestCase, ...]:
    counts = _case_counts(buckets, summary, run)
    pairs = dict.fromkeys([*counts, *configured_impls(run).items(), *((b.op, b.impl) for b in buckets)])
    seconds = float(summary.get("seconds") or 0.0)
    total = sum(counts.values())
    out = []
    for op, impl in pairs:
        # Time is only known per run (or shard): share it by cases.
        share = counts.get((op, impl), 0) / total if total else 1.0 / len(pairs)
        out.append(
            TestCase(
                op=op,
                impl=impl,
                buckets=tuple(b for b in buckets if (b.op, b.impl) == (op, impl)),
                cases=counts.get((op, impl)),
                seconds=seconds * share,
            )
        )
    return tuple(sorted(out, key=lambda t: (t.op, t.impl)))


@dataclass(frozen=True, kw_only=True)
class RunView:
    """What a run directory holds, read once: its findings, summary, config and reading notes."""

    run_dir: Path
    findings: tuple[Finding, ...]
    summary: Mapping[str, Any]
    run: Mapping[str, Any]
    notes: tuple[str, ...]

    def pairs(self) -> set[tuple[str, str]]:
        """The (op, impl) pairs the run fuzzed (from its config, else its findings)."""
        raw = group_buckets(self.findings, Judgement())
        return {(t.op, t.impl) for t in _testcases(raw, self.summary, self.run)}


def load_run(run_dir: Path | str) -> RunView:
    """Read a run directory; a ReportError (one line) if it is not one."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"run_dir={run_dir}: no such directory")
    findings_path, summary_path = run_dir / FINDINGS_FILE, run_dir / SUMMARY_FILE
    if not findings_path.is_file() and not summary_path.is_file():
        raise ReportError(
            f"run_dir={run_dir}: neither {FINDINGS_FILE} nor {SUMMARY_FILE} (not an mlafuzz run directory)"
        )
    notes: list[str] = []
    try:
        findings = tuple(read_findings(findings_path)) if findings_path.is_file() else ()
    except JsonlError as exc:
        raise ReportError(f"run_dir={run_dir}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(
            f"run_dir={run_dir}: {FINDINGS_FILE} holds a record that is not a finding: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None
    summary = _read_json(summary_path, notes)
    if not summary_path.is_file():
        notes.append(f"no {SUMMARY_FILE}: the run was killed or is still running; counts come from {FINDINGS_FILE}")
    run = _read_json(run_dir / RUN_FILE, notes)
    return RunView(run_dir=run_dir, findings=findings, summary=summary, run=run, notes=tuple(notes))


def build_report(view: RunView, judgement: Judgement) -> RunReport:
    """The run as every format renders it, under the harness's judgement."""
    buckets = group_buckets(view.findings, judgement, bucket_counts(view.summary))
    testcases = _testcases(buckets, view.summary, view.run)
    return RunReport(
        run_dir=view.run_dir,
        findings=view.findings,
        buckets=buckets,
        testcases=testcases,
        summary=view.summary,
        run=view.run,
        stale=judgement.stale,
        not_applicable=judgement.not_applicable,
        ledger=judgement.ledger,
        notes=view.notes,
    )


# --- replay -----------------------------------------------------------------


def _bundle_replay(finding: Finding, bundles: Any) -> str | None:
    """summary.json's ``bundles``: [{"bucket": [kind, op, impl, cause], "replay": "mlafuzz replay ..."}, ...]."""
    if not isinstance(bundles, list):
        return None
    for b in bundles:
        if isinstance(b, Mapping) and tuple(b.get("bucket") or ()) == finding.dedup_key and b.get("replay"):
            return str(b["replay"])
    return None


def replay_command(finding: Finding, run: Mapping[str, Any] | None = None, *, bundles: Any = None) -> str | None:
    """How to reproduce ``finding``, best first; None when the run recorded no way.

    1. ``finding.repro``: its bundle's one-line replay command (a bare path is
       taken as the bundle folder);
    2. the bundle summary.json lists for the finding's bucket (bundles are
       written after the loop, so findings.jsonl lines don't carry them);
    3. a re-run of the same cases from run.json's seed and shard (case i is a
       pure function of seed and i).
    """
    if finding.repro:
        repro = finding.repro.strip()
        return repro if any(c.isspace() for c in repro) else command("replay", repro)
    from_bundle = _bundle_replay(finding, bundles)
    if from_bundle:
        return from_bundle
    shard = finding.extra.get("shard") if isinstance(finding.extra, Mapping) else None
    run = dict(run or {})
    if isinstance(shard, Mapping) and isinstance(shard.get("run"), Mapping):
        run = dict(shard["run"])  # a merged run: the finding's own shard config
    if "seed" not in run:
        return None
    parts = ["fuzz", "--op", finding.op, "--impl", f"{finding.op}={finding.impl}"]
    if run.get("device"):
        parts += ["--device", str(run["device"]).split(":")[0]]
    parts += ["--seed", str(run["seed"])]
    revision = finding.revision or run.get("revision")
    if isinstance(revision, str) and revision:
        parts += ["--revision", revision]
    shard_text = shard_label(run.get("shard"))
    if shard_text and shard_text != "0/1":
        parts += ["--shard", shard_text]
    declared = (run.get("features") or {}).get(finding.op) if isinstance(run.get("features"), Mapping) else None
    if declared:  # the run's cases drew these surfaces: the re-run must declare them too
        parts += ["--features", f"{finding.op}={','.join(str(n) for n in declared)}"]
    if isinstance(run.get("cases"), int):
        parts += ["--cases", str(run["cases"])]
    return command(*parts)


def shard_label(shard: Any) -> str | None:
    """'K/N' from run.json's shard, given as 'K/N', [K, N] or {"index": K, "count": N}."""
    if isinstance(shard, str) and "/" in shard:
        return shard
    if isinstance(shard, (list, tuple)) and len(shard) == 2:
        return f"{shard[0]}/{shard[1]}"
    if isinstance(shard, Mapping) and "index" in shard and "count" in shard:
        return f"{shard['index']}/{shard['count']}"
    return None
