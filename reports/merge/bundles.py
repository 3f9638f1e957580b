"""The shards' repro bundles, copied into the merged folder so that it is the whole artifact.

One bundle per bucket (the first shard's); each copy's replay.txt and finding.json's ``repro`` are
rewritten to point at the copy, so the merged folder's reports replay from it alone.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from mlafuzz.reports.atomic import atomic_write
from mlafuzz.reports.bundle import BundleError, read_case_json, replay_command
from mlafuzz.reports.findings import Finding
from mlafuzz.reports.rundir import BUNDLES_DIR


def _bucket_of(bundle: Path) -> list[str] | None:
    """The bucket (kind, op, impl, cause) a bundle's finding.json names; None when unreadable."""
    try:
        return list(Finding.from_json(json.loads((bundle / "finding.json").read_text(encoding="utf-8"))).dedup_key)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _copy_one(src: Path, out: Path, case: Mapping[str, Any]) -> tuple[Path, str]:
    """Copy bundle ``src`` into ``out/bundles`` under a temporary name, then rename: whole or absent."""
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
    return dest, command


def copy_bundles(d: Path, index: int, listed: list[Mapping[str, Any]], out: Path, taken: set[tuple]) -> list[dict]:
    """Copy shard ``d``'s bundles into ``out/bundles``: those its summary lists, and any on disk it
    does not (a shard killed after writing one). A bucket another shard already brought is not
    copied again; one listed but absent (uploaded without bundles/) is kept as ``missing``."""
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
        dest, command = _copy_one(src, out, case)
        taken.add(tuple(bucket))
        entries.append({**entry, "bucket": list(bucket), "path": str(dest), "replay": command, "shard": index})
    for b in by_name.values():
        if tuple(b.get("bucket") or ()) not in taken:
            entries.append({k: v for k, v in b.items() if k != "replay"} | {"shard": index, "missing": True})
    return entries
