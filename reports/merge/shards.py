"""Which run directories a merge takes: read them, check that they are shards of one run, drop
repeats, and name the shards that are missing.

Shards of one run share its seed, its shard scheme (the N of K/N), its implementations and its
ledger: anything else is refused in one line, since the counts would not add up to any run and
one ledger could not judge them all. A directory whose run.json says it ran the same cases as
another (same seed, shard, ops, implementations and case knobs: a shard uploaded twice, a job
re-run into a second folder) is a duplicate: the one with fewer cases is dropped, and the result
says so. A scheme of N whose shards K are not all there is a partial merge: its counts are not
the run's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from mlafuzz.reports.findings import Finding
from mlafuzz.reports.jsonl import FINDINGS_FILE, JsonlError, read_jsonl
from mlafuzz.reports.model import RUN_FILE, SUMMARY_FILE, ReportError, configured_impls, shard_label

# run.json keys that do not change which cases a run made (how many it made, how long it might take).
_NOT_IDENTITY = frozenset({"cases", "budget", "timeout", "merged_from"})


@dataclass(frozen=True, kw_only=True)
class ShardDir:
    """One run directory given to merge: its run.json and summary.json ({} when missing)."""

    dir: Path
    run: Mapping[str, Any]
    summary: Mapping[str, Any]

    @property
    def label(self) -> str | None:
        """'K/N' from run.json; None without one: never guessed from the order."""
        return shard_label(self.run.get("shard"))


@dataclass(frozen=True, kw_only=True)
class Dropped:
    """A run directory left out of a merge: it repeats the cases of ``kept``."""

    dir: Path
    kept: Path
    seed: Any
    shard: str | None


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"merge: {path}: not valid JSON: {' '.join(str(exc).split())}") from None
    return data if isinstance(data, dict) else {}


def load_records(shard: ShardDir) -> list[tuple[dict[str, Any], Finding]]:
    """The shard's findings.jsonl lines, each with the finding it holds (for its bucket)."""
    path = shard.dir / FINDINGS_FILE
    try:
        records = list(read_jsonl(path)) if path.is_file() else []
        return [(rec, Finding.from_json(rec)) for rec in records]
    except JsonlError as exc:
        raise ReportError(f"merge: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(
            f"merge: {path}: holds a record that is not a finding: {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None


def read_shards(dirs: list[Path], out: Path) -> list[ShardDir]:
    """The run directories, read and checked to be shards of one run (ReportError, one line, if not)."""
    _check_dirs(dirs, out)
    shards = [ShardDir(dir=d, run=_load_json(d / RUN_FILE), summary=_load_json(d / SUMMARY_FILE)) for d in dirs]
    _check_implementations(shards)
    for what, value, show in _AGREE:
        told = [s for s in shards if s.run and value(s.run) is not None]
        for s in told[1:]:
            if value(s.run) != value(told[0].run):
                raise ReportError(
                    f"merge: the runs have different {what} ({told[0].dir}: {show(told[0].run)}, {s.dir}:"
                    f" {show(s.run)}): {_WHY[what]}"
                )
    return shards


def _check_dirs(dirs: list[Path], out: Path) -> None:
    """Each of ``dirs`` a run directory, given once, and ``out`` none of them."""
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


def _scheme(run: Mapping[str, Any]) -> str | None:
    label = shard_label(run.get("shard"))
    return label.partition("/")[2] if label else None


def _ledger_entries(run: Mapping[str, Any]) -> str:
    """The recorded ledger's entries (what judges the run; its file's path may differ per job)."""
    record = run.get("ledger")
    return json.dumps(record.get("expected") if isinstance(record, Mapping) else None, sort_keys=True)


def _show_ledger(run: Mapping[str, Any]) -> str:
    record = run.get("ledger")
    if not isinstance(record, Mapping):
        return "no ledger"
    return f"ledger {record.get('file')} of {len(record.get('expected') or ())} entries"


_AGREE: tuple[tuple[str, Callable[[Mapping[str, Any]], Any], Callable[[Mapping[str, Any]], str]], ...] = (
    ("seeds", lambda r: r.get("seed"), lambda r: f"seed {r.get('seed')}"),
    ("shard schemes", _scheme, lambda r: f"shard {shard_label(r.get('shard'))}"),
    ("ledgers", _ledger_entries, _show_ledger),
)
_WHY = {
    "seeds": "shards of one run share its seed and its K/N split",
    "shard schemes": "shards of one run share its seed and its K/N split",
    "ledgers": "shards of one run are judged by one ledger; run them with the same --ledger",
}


def _check_implementations(shards: list[ShardDir]) -> None:
    impls = [(s.dir, configured_impls(s.run)) for s in shards if s.run]
    for d, mine in impls[1:]:
        d0, first = impls[0]
        for op in sorted(set(mine) & set(first)):
            if mine[op] != first[op]:
                raise ReportError(
                    f"merge: the runs fuzz different implementations of {op} ({d0}: {op}={first[op]},"
                    f" {d}: {op}={mine[op]}): shards of one run fuzz the same ones; merge each"
                    " implementation's shards on their own"
                )


def without_duplicates(shards: list[ShardDir]) -> tuple[list[ShardDir], list[Dropped]]:
    """The shards to merge, in order, and the ones dropped as repeats of another's cases."""
    kept: dict[str, int] = {}  # identity -> position in order
    order: list[ShardDir] = []
    dropped: list[Dropped] = []
    for shard in shards:
        if not shard.run or "seed" not in shard.run:  # nothing says which cases it ran: never guessed
            order.append(shard)
            continue
        identity = json.dumps(
            {k: v for k, v in shard.run.items() if k not in _NOT_IDENTITY}, sort_keys=True, default=str
        )
        if identity not in kept:
            kept[identity] = len(order)
            order.append(shard)
            continue
        other = order[kept[identity]]
        keep, drop = (shard, other) if _cases(shard) > _cases(other) else (other, shard)
        order[kept[identity]] = keep
        dropped.append(Dropped(dir=drop.dir, kept=keep.dir, seed=shard.run.get("seed"), shard=shard.label))
    return order, dropped


def _cases(shard: ShardDir) -> int:
    return int(shard.summary.get("cases") or 0)


def missing_shards(shards: list[ShardDir]) -> list[str]:
    """The K/N labels of the run's shards that are not among ``shards``; [] when every shard is
    there, or when a directory without run.json leaves it unknown which shard that one is."""
    labels = [s.label for s in shards]
    if not labels or None in labels:
        return []
    count = int(str(labels[0]).partition("/")[2])
    present = {int(str(label).partition("/")[0]) for label in labels}
    return [f"{k}/{count}" for k in range(count) if k not in present]
