"""The merged run's files: its findings lines and its summary, summed from the shards'.

Every findings line of every kept shard is kept, in shard order, with ``extra["shard"]`` saying
which shard directory (and, when its run.json exists, which seed/shard config) it came from, so a
finding stays replayable after the merge. Counts (cases, skipped, findings, infos, per op, per
kind, per feature, per bucket) are summed; ``buckets`` is recounted over the merged findings by
``Finding.dedup_key`` (the same bucket in two shards is one bucket); ``seconds`` is the slowest
shard's (shards run side by side) and ``shard_seconds`` their sum. A shard without summary.json
(killed) counts what its findings lines show, and the merge is partial.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from mlafuzz.reports.findings import Finding, Severity
from mlafuzz.reports.merge.shards import ShardDir
from mlafuzz.reports.model import BUCKET_SEP, bucket_counts, impls_from_findings

Records = list[tuple[dict[str, Any], Finding]]

_SUMMED = ("cases", "skipped", "findings", "infos", "worker_restarts", "lines_dropped", "cut", "tie_hits")
_COUNTERS = ("per_op", "by_kind", "coverage", "features", "skip_reasons")  # key -> n, or op -> key -> n: summed per key
_RUN_KEYS = ("seed", "device", "shard", "cases", "features")  # what a finding needs to be re-run


def merged_lines(shards: list[ShardDir], records: list[Records]) -> list[str]:
    """Every findings line of every shard, in shard order, each saying where it came from."""
    lines = []
    for index, (shard, recs) in enumerate(zip(shards, records)):
        origin: dict[str, Any] = {"index": index, "dir": str(shard.dir), "label": shard.label}
        if shard.run:
            origin["run"] = {k: shard.run[k] for k in _RUN_KEYS if k in shard.run}
        for rec, _ in recs:
            extra = dict(rec.get("extra") or {})
            extra.setdefault("shard", origin)  # a re-merged line keeps its first, most precise origin
            lines.append(json.dumps({**rec, "extra": extra}, sort_keys=True, allow_nan=False, default=str))
    return lines


def counted(shard: ShardDir, records: Records) -> Mapping[str, Any]:
    """The shard's summary; a killed shard's (none written) counted from its findings lines."""
    if shard.summary:
        return shard.summary
    errors = sum(1 for _, f in records if f.severity is Severity.ERROR)
    return {"findings": errors, "infos": len(records) - errors}


def _add_nested(total: dict[str, Any], part: Mapping[str, Any]) -> None:
    """Sum ``part`` into ``total``: numbers add, mappings recurse (features: op -> feature -> n)."""
    for key, value in part.items():
        if isinstance(value, Mapping):
            _add_nested(total.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value


def _bucket_totals(records: list[Records], summaries: list[Mapping[str, Any]]) -> dict[str, int]:
    """Every bucket's number of findings: a shard's summary counts them all (its findings file
    keeps a sample); a killed shard's lines are all it can show."""
    per_bucket: dict[str, int] = {}
    for recs, summary in zip(records, summaries):
        counts = bucket_counts(summary)
        if not counts:
            for _, f in recs:
                counts[f.dedup_key] = counts.get(f.dedup_key, 0) + 1
        for key, n in counts.items():
            per_bucket[BUCKET_SEP.join(key)] = per_bucket.get(BUCKET_SEP.join(key), 0) + n
    return per_bucket


def _shard_row(index: int, shard: ShardDir, records: Records, summary: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "index": index,
        "dir": str(shard.dir),
        "shard": shard.label,
        "cases": summary.get("cases"),
        "findings": summary.get("findings"),
        "infos": summary.get("infos"),
        "seconds": summary.get("seconds"),
        "findings_lines": len(records),
        "has_summary": bool(shard.summary),
        "interrupted": bool(summary.get("interrupted")),
        "per_op": summary.get("per_op") or {},
        "impls": shard.run.get("impls") or impls_from_findings((f.op, f.impl) for _, f in records),
    }


def merged_summary(
    shards: list[ShardDir],
    records: list[Records],
    summaries: list[Mapping[str, Any]],
    *,
    bundles: list[dict[str, Any]],
    missing: list[str],
) -> dict[str, Any]:
    """summary.json of the merge (see the module docstring); ``missing``: the run's shards not given."""
    totals: dict[str, Any] = {k: 0 for k in _SUMMED}
    counters: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        for key in _SUMMED:
            value = summary.get(key, 0)
            totals[key] += value if isinstance(value, int) else 0
        for key in _COUNTERS:
            if isinstance(summary.get(key), Mapping):
                _add_nested(counters.setdefault(key, {}), summary[key])
    seconds = [float(s.get("seconds") or 0.0) for s in summaries]
    wall = max(seconds, default=0.0)
    buckets = {f.dedup_key for recs in records for _, f in recs if f.severity is Severity.ERROR}
    return {
        **totals,
        "per_op": {},
        "by_kind": {},
        **counters,
        "buckets": len(buckets),
        "bundles": bundles,
        "bucket_counts": _bucket_totals(records, summaries),
        "seconds": round(wall, 3),
        "shard_seconds": round(sum(seconds), 3),
        "cases_per_second": round(totals["cases"] / wall, 3) if wall > 0 else 0.0,
        "interrupted": any(bool(s.get("interrupted")) for s in summaries),
        "terminated": any(bool(s.get("terminated")) for s in summaries),
        "partial": bool(missing) or not all(s.summary for s in shards),
        "missing_shards": missing,
        "shards": [_shard_row(i, *row) for i, row in enumerate(zip(shards, records, summaries))],
    }
