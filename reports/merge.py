"""Merge shard run directories into one: findings concatenated, counts summed, provenance kept.

Shards of one run share its seed and its shard scheme (the N of K/N): a merge
of runs with different seeds or schemes is refused, since their counts would
not add up to any run. A directory whose run.json says it ran the same cases
as another (same seed, shard, ops, implementations and case knobs: a shard
uploaded twice, a job re-run into a second folder) is a duplicate: the one
with fewer cases is dropped, and the result says so (``MergeResult.dropped``).

Every findings line of every kept shard is kept, in shard order, with
``extra["shard"]`` saying which shard directory (and, when its run.json
exists, which seed/shard config) it came from, so a finding stays replayable
after the merge. Each shard's repro bundles are copied into ``OUT/bundles``
(one per bucket: the first shard's), their replay.txt and finding.json's
``repro`` rewritten to the copy, so the merged folder is the whole artifact a
triager needs and its reports point into it. Counts (cases,
skipped, findings, infos, per op, per kind, per feature, per bucket) are
summed; ``buckets`` is recounted over the merged findings (the same bucket in
two shards is one bucket); ``seconds`` is the slowest shard's (shards run side
by side) and ``shard_seconds`` their sum.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from mlafuzz.reports.atomic import atomic_write
from mlafuzz.reports.bundle import BundleError, read_case_json, replay_command
from mlafuzz.reports.findings import Finding
from mlafuzz.reports.jsonl import FINDINGS_FILE, JsonlError, read_jsonl
from mlafuzz.reports.model import (
    BUCKET_SEP,
    RUN_FILE,
    SUMMARY_FILE,
    ReportError,
    bucket_counts,
    configured_impls,
    impls_from_findings,
    shard_label,
)
from mlafuzz.reports.rundir import BUNDLES_DIR, clear_run, holds_run

_SUMMED = ("cases", "skipped", "findings", "infos", "worker_restarts")
_COUNTERS = ("per_op", "by_kind", "coverage", "features", "skip_reasons")  # key -> n, or op -> key -> n: summed per key
_RUN_KEYS = ("seed", "device", "shard", "cases", "features")  # what a finding needs to be re-run
# run.json keys that do not change which cases a run made (how many it made, how long it might take).
_NOT_IDENTITY = frozenset({"cases", "budget", "timeout", "merged_from"})


@dataclass(frozen=True, kw_only=True)
class Dropped:
    """A run directory left out of a merge: it repeats the cases of ``kept``."""

    dir: Path
    kept: Path
    seed: Any
    shard: str | None


@dataclass(frozen=True, kw_only=True)
class MergeResult:
    out: Path
    shards: int
    findings_lines: int
    summary: Mapping[str, Any]
    dropped: tuple[Dropped, ...] = ()
    bundles: int = 0  # repro bundles copied into out/bundles


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"merge: {path}: not valid JSON: {' '.join(str(exc).split())}") from None
    return data if isinstance(data, dict) else {}


def _load_records(path: Path) -> list[dict[str, Any]]:
    try:
        return list(read_jsonl(path)) if path.is_file() else []
    except JsonlError as exc:
        raise ReportError(f"merge: {exc}") from None


def _check_dirs(dirs: list[Path], out: Path) -> None:
    if not dirs:
        raise ReportError("merge: dirs=[] must name at least one run directory")
    seen: set[Path] = set()
    for d in dirs:
        if not d.is_dir():
            raise ReportError(f"merge: dir={d}: no such directory")
        if not (d / FINDINGS_FILE).is_file() and not (d / SUMMARY_FILE).is_file():
            raise ReportError(f"merge: dir={d}: neither {FINDINGS_FILE} nor {SUMMARY_FILE} (not a run directory)")
        if d.resolve() in seen:
            raise ReportError(f"merge: dir={d} is given twice")
        seen.add(d.resolve())
    if out.resolve() in seen:
        raise ReportError(f"merge: out={out} is one of the inputs; merge into a new directory")


def _add_nested(total: dict[str, Any], part: Mapping[str, Any]) -> None:
    """Sum ``part`` into ``total``: numbers add, mappings recurse (features: op -> feature -> n)."""
    for key, value in part.items():
        if isinstance(value, Mapping):
            _add_nested(total.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value


def _scheme(run: Mapping[str, Any]) -> str | None:
    label = shard_label(run.get("shard"))
    return label.partition("/")[2] if label else None


def _check_one_run(dirs: list[Path], runs: list[dict[str, Any]]) -> None:
    """ReportError unless the runs that say their seed and shard share one seed and one scheme."""
    checks = (
        ("seeds", lambda r: r.get("seed"), lambda r: f"seed {r.get('seed')}"),
        ("shard schemes", _scheme, lambda r: f"shard {shard_label(r.get('shard'))}"),
    )
    impls = [(d, configured_impls(r)) for d, r in zip(dirs, runs) if r]
    for d, mine in impls[1:]:
        for d0, first in impls[:1]:
            for op in sorted(set(mine) & set(first)):
                if mine[op] != first[op]:
                    raise ReportError(
                        f"merge: the runs fuzz different implementations of {op} ({d0}: {op}={first[op]},"
                        f" {d}: {op}={mine[op]}): shards of one run fuzz the same ones; merge each"
                        " implementation's shards on their own"
                    )
    for what, value, show in checks:
        told = [(d, r) for d, r in zip(dirs, runs) if r and value(r) is not None]
        for d, r in told[1:]:
            d0, r0 = told[0]
            if value(r) != value(r0):
                raise ReportError(
                    f"merge: the runs have different {what} ({d0}: {show(r0)}, {d}: {show(r)}):"
                    " shards of one run share its seed and its K/N split"
                )


def _without_duplicates(
    dirs: list[Path], runs: list[dict[str, Any]], summaries: list[dict[str, Any]]
) -> tuple[list[int], list[Dropped]]:
    """Indices of the directories to merge, and the ones dropped as repeats of another's cases."""
    kept: dict[str, int] = {}
    dropped: list[Dropped] = []
    order: list[int] = []
    for i, run in enumerate(runs):
        if not run or "seed" not in run:  # nothing says which cases it ran: never guessed
            order.append(i)
            continue
        identity = json.dumps({k: v for k, v in run.items() if k not in _NOT_IDENTITY}, sort_keys=True, default=str)
        j = kept.get(identity)
        if j is None:
            kept[identity] = i
            order.append(i)
            continue
        more = int(summaries[i].get("cases") or 0) > int(summaries[j].get("cases") or 0)
        keep, drop = (i, j) if more else (j, i)
        if more:
            order[order.index(j)] = i
            kept[identity] = i
        dropped.append(
            Dropped(dir=dirs[drop], kept=dirs[keep], seed=run.get("seed"), shard=shard_label(run.get("shard")))
        )
    return order, dropped


def _common_run(runs: list[dict[str, Any]], dirs: list[Path]) -> dict[str, Any]:
    """The run.json of the merge: the keys all shards agree on (never the shard), and where it came from."""
    present = [r for r in runs if r]
    merged: dict[str, Any] = {}
    if present and len(present) == len(runs):
        for key, value in present[0].items():
            if key != "shard" and all(r.get(key) == value for r in present[1:]):
                merged[key] = value
    merged["merged_from"] = [str(d) for d in dirs]
    return merged


def _bucket_of(bundle: Path) -> list[str] | None:
    """The bucket (kind, op, impl, cause) a bundle's finding.json names; None when unreadable."""
    try:
        return list(Finding.from_json(json.loads((bundle / "finding.json").read_text(encoding="utf-8"))).dedup_key)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _copy_bundles(d: Path, index: int, listed: list[Mapping[str, Any]], out: Path, taken: set[tuple]) -> list[dict]:
    """Copy shard ``d``'s bundles into ``out/bundles``: those its summary lists, and any on disk it
    does not (a shard killed after writing one). A bucket another shard already brought is not
    copied again. Each copy is made under a temporary name and renamed: whole or absent."""
    by_name = {Path(str(b.get("path", ""))).name: b for b in listed}
    on_disk = (
        sorted(p for p in (d / BUNDLES_DIR).iterdir() if (p / "case.json").is_file())
        if (d / BUNDLES_DIR).is_dir()
        else []
    )
    entries = []
    for src in on_disk:
        entry = dict(by_name.pop(src.name, None) or {})
        bucket = entry.get("bucket") or _bucket_of(src)
        if not bucket or tuple(bucket) in taken:
            continue
        try:
            case = read_case_json(src)
        except BundleError:
            continue
        dest = out / BUNDLES_DIR / src.name
        partial = dest.with_name(f".{src.name}.merging")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(src, partial)
        command = replay_command(dest, op=str(case.get("op", "")), impl=str(case.get("impl", "")))
        atomic_write(partial / "replay.txt", command + "\n")
        finding_path = partial / "finding.json"
        try:
            finding = json.loads(finding_path.read_text(encoding="utf-8"))
            finding["repro"] = command
            atomic_write(finding_path, json.dumps(finding, indent=2, sort_keys=True) + "\n")
        except (OSError, ValueError, TypeError):
            pass  # the copy keeps what the shard wrote; replay says what is wrong with it
        os.replace(partial, dest)
        taken.add(tuple(bucket))
        entries.append({**entry, "bucket": list(bucket), "path": str(dest), "replay": command, "shard": index})
    for b in by_name.values():  # listed, but the shard folder lacks it (uploaded without bundles/)
        if tuple(b.get("bucket") or ()) not in taken:
            entries.append({k: v for k, v in b.items() if k != "replay"} | {"shard": index, "missing": True})
    return entries


def merge_runs(dirs: Iterable[Path | str], out: Path | str, *, overwrite: bool = False) -> MergeResult:
    """Merge shard run directories ``dirs`` into ``out``. An ``out`` that holds a run (an earlier
    merge or fuzz) is refused, as ``fuzz --out`` refuses it, unless ``overwrite``: its run files
    and bundles are removed first."""
    dirs = [Path(d) for d in dirs]
    out = Path(out)
    _check_dirs(dirs, out)
    all_runs = [_load_json(d / RUN_FILE) for d in dirs]
    all_summaries = [_load_json(d / SUMMARY_FILE) for d in dirs]
    _check_one_run(dirs, all_runs)
    order, dropped = _without_duplicates(dirs, all_runs, all_summaries)
    all_records = {i: _load_records(dirs[i] / FINDINGS_FILE) for i in order}  # read all before writing any
    if holds_run(out):
        if not overwrite:
            raise ReportError(
                f"merge: --out {out} holds an earlier run (its findings would mix with this one's):"
                " pass --overwrite to replace it, or another --out"
            )
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)
    taken: set[tuple] = set()
    per_bucket: dict[str, int] = {}
    lines: list[str] = []
    totals: dict[str, Any] = {k: 0 for k in _SUMMED}
    counters: dict[str, dict[str, Any]] = {}
    bundles: list[dict[str, Any]] = []
    buckets: set[tuple] = set()
    shards: list[dict[str, Any]] = []
    seconds: list[float] = []
    runs: list[dict[str, Any]] = []
    interrupted = partial = False
    kept_dirs = [dirs[i] for i in order]
    for index, i in enumerate(order):
        d, summary, run = dirs[i], all_summaries[i], all_runs[i]
        runs.append(run)
        label = shard_label(run.get("shard"))  # None without run.json: never guessed from the order
        origin: dict[str, Any] = {"index": index, "dir": str(d), "label": label}
        if run:
            origin["run"] = {k: run[k] for k in _RUN_KEYS if k in run}
        records = all_records[i]
        for rec in records:
            extra = dict(rec.get("extra") or {})
            extra.setdefault("shard", origin)  # a re-merged line keeps its first, most precise origin
            rec["extra"] = extra
            lines.append(json.dumps(rec, sort_keys=True, allow_nan=False, default=str))
            if rec.get("severity", "error") == "error":
                buckets.add((rec.get("kind"), rec.get("op"), rec.get("impl"), rec.get("cause", "")))
        counts = bucket_counts(summary)
        if not counts:  # an older or killed shard: its findings lines are all it can show
            for rec in records:
                key = BUCKET_SEP.join(str(rec.get(k, "")) for k in ("kind", "op", "impl", "cause"))
                per_bucket[key] = per_bucket.get(key, 0) + 1
        for key, n in counts.items():
            per_bucket[BUCKET_SEP.join(key)] = per_bucket.get(BUCKET_SEP.join(key), 0) + n
        has_summary = bool(summary)
        if not has_summary:  # a killed shard: count what its findings file shows, and say the total is partial
            partial = True
            summary = {
                "findings": sum(1 for r in records if r.get("severity", "error") == "error"),
                "infos": sum(1 for r in records if r.get("severity") == "info"),
            }
        for key in _SUMMED:
            value = summary.get(key, 0)
            totals[key] += value if isinstance(value, int) else 0
        for key in _COUNTERS:
            if isinstance(summary.get(key), Mapping):
                _add_nested(counters.setdefault(key, {}), summary[key])
        listed = [b for b in summary.get("bundles") or () if isinstance(b, Mapping)]
        bundles += _copy_bundles(d, index, listed, out, taken)
        seconds.append(float(summary.get("seconds") or 0.0))
        interrupted |= bool(summary.get("interrupted"))
        shards.append(
            {
                "index": index,
                "dir": str(d),
                "shard": label,
                "cases": summary.get("cases"),
                "findings": summary.get("findings"),
                "infos": summary.get("infos"),
                "seconds": summary.get("seconds"),
                "findings_lines": len(records),
                "has_summary": has_summary,
                "per_op": summary.get("per_op") or {},
                "impls": run.get("impls") or impls_from_findings((r.get("op"), r.get("impl")) for r in records),
            }
        )
    wall = max(seconds, default=0.0)
    merged = {
        **totals,
        "per_op": {},
        "by_kind": {},
        **counters,
        "buckets": len(buckets),
        "bundles": bundles,
        "bucket_counts": per_bucket,
        "seconds": round(wall, 3),
        "shard_seconds": round(sum(seconds), 3),
        "cases_per_second": round(totals["cases"] / wall, 3) if wall > 0 else 0.0,
        "interrupted": interrupted,
        "partial": partial,
        "shards": shards,
    }
    atomic_write(out / FINDINGS_FILE, "".join(line + "\n" for line in lines))
    atomic_write(out / SUMMARY_FILE, json.dumps(merged, indent=2) + "\n")
    if any(runs):
        atomic_write(out / RUN_FILE, json.dumps(_common_run(runs, kept_dirs), indent=2, default=str) + "\n")
    return MergeResult(
        out=out,
        shards=len(kept_dirs),
        findings_lines=len(lines),
        summary=merged,
        dropped=tuple(dropped),
        bundles=sum(1 for b in bundles if not b.get("missing")),
    )
