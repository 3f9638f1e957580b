"""Merge shard run directories into one: findings concatenated, counts summed, provenance kept.

``merge_runs`` reads the shards and checks they are one run's (``shards.py``: same seed, scheme,
implementations and ledger; repeats dropped; missing shards named), then writes the merged
findings and summary (``totals.py``) and copies the bundles (``bundles.py``). The merged run.json
keeps what every shard agrees on, the recorded ledger included, so ``report`` of the merge judges
it as each shard was judged. A merge that lacks a shard of the run's K/N scheme, or a shard's
summary, is partial: ``partial: true``, ``missing_shards``, and ``MergeResult.partial``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from mlafuzz.reports.atomic import atomic_write
from mlafuzz.reports.jsonl import FINDINGS_FILE
from mlafuzz.reports.merge.bundles import copy_bundles
from mlafuzz.reports.merge.shards import (
    Dropped,
    ShardDir,
    load_records,
    missing_shards,
    read_shards,
    without_duplicates,
)
from mlafuzz.reports.merge.totals import counted, merged_lines, merged_summary
from mlafuzz.reports.model import RUN_FILE, SUMMARY_FILE, ReportError
from mlafuzz.reports.rundir import clear_run, holds_run

__all__ = ["Dropped", "MergeResult", "merge_runs"]


@dataclass(frozen=True, kw_only=True)
class MergeResult:
    out: Path
    shards: int
    findings_lines: int
    summary: Mapping[str, Any]
    dropped: tuple[Dropped, ...] = ()
    bundles: int = 0  # repro bundles copied into out/bundles

    @property
    def missing(self) -> list[str]:
        """The K/N labels of the run's shards the merge did not get."""
        return list(self.summary.get("missing_shards") or ())

    @property
    def partial(self) -> bool:
        """The merged counts are not the whole run's: a shard is missing or has no summary."""
        return bool(self.summary.get("partial"))


def _common_run(shards: list[ShardDir]) -> dict[str, Any]:
    """The run.json of the merge: the keys all shards agree on (never the shard), and where it came from."""
    runs = [s.run for s in shards]
    merged: dict[str, Any] = {}
    if all(runs):
        for key, value in runs[0].items():
            if key != "shard" and all(r.get(key) == value for r in runs[1:]):
                merged[key] = value
    merged["merged_from"] = [str(s.dir) for s in shards]
    return merged


def _settle_out(out: Path, *, overwrite: bool) -> None:
    if holds_run(out):
        if not overwrite:
            raise ReportError(
                f"merge: --out {out} holds an earlier run (its findings would mix with this one's):"
                " pass --overwrite to replace it, or another --out"
            )
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)


def merge_runs(dirs: Iterable[Path | str], out: Path | str, *, overwrite: bool = False) -> MergeResult:
    """Merge shard run directories ``dirs`` into ``out``. An ``out`` that holds a run (an earlier
    merge or fuzz) is refused, as ``fuzz --out`` refuses it, unless ``overwrite``: its run files
    and bundles are removed first."""
    out = Path(out)
    kept, dropped = without_duplicates(read_shards([Path(d) for d in dirs], out))
    records = [load_records(s) for s in kept]  # read all before writing any
    _settle_out(out, overwrite=overwrite)
    summaries = [counted(s, recs) for s, recs in zip(kept, records)]
    taken: set[tuple] = set()
    bundles: list[dict[str, Any]] = []
    for index, (shard, summary) in enumerate(zip(kept, summaries)):
        listed = [b for b in summary.get("bundles") or () if isinstance(b, Mapping)]
        bundles += copy_bundles(shard.dir, index, listed, out, taken)
    merged = merged_summary(kept, records, summaries, bundles=bundles, missing=missing_shards(kept))
    lines = merged_lines(kept, records)
    atomic_write(out / FINDINGS_FILE, "".join(line + "\n" for line in lines))
    atomic_write(out / SUMMARY_FILE, json.dumps(merged, indent=2) + "\n")
    if any(s.run for s in kept):
        atomic_write(out / RUN_FILE, json.dumps(_common_run(kept), indent=2, default=str) + "\n")
    return MergeResult(
        out=out,
        shards=len(kept),
        findings_lines=len(lines),
        summary=merged,
        dropped=tuple(dropped),
        bundles=sum(1 for b in bundles if not b.get("missing")),
    )
