"""A run folder's own files: whether a folder holds a run, can take one, and how to clear one.

A run folder holds run.json, summary.json, findings.jsonl and bundles/ (one
folder per bucket, each with its case.json). Clearing removes exactly those
and atomic writes' leftovers, and nothing else: ``--out .`` with
``--overwrite`` must not take a user's own files with it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from mlafuzz.reports.atomic import temporary_of
from mlafuzz.reports.jsonl import FINDINGS_FILE
from mlafuzz.reports.model import RUN_FILE, SUMMARY_FILE

BUNDLES_DIR = "bundles"
RUN_FILES = (FINDINGS_FILE, SUMMARY_FILE, RUN_FILE)


class RunDirError(ValueError):
    """A folder that cannot hold a run; the message is one line."""


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds (part of) an earlier run."""
    path = Path(path)
    return path.is_dir() and (any((path / name).exists() for name in RUN_FILES) or (path / BUNDLES_DIR).is_dir())


def check_writable(path: Path, *, what: str) -> None:
    """RunDirError unless ``path`` is, or can be created as, a folder this process can write.
    Nothing is created: a mistyped path must not leave folders behind when the run is refused."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{what} {path}: is a file, not a folder")
    probe = path
    while not probe.exists():  # the nearest existing ancestor is where the folder would be made
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise RunDirError(f"{what} {path}: cannot be created: {probe} is a file, not a folder")
    if probe == path:
        _probe(
            path,
            what=what,
            make=lambda p: os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)),
            undo=os.unlink,
            why="not writable",
        )
    else:  # where the folder would be made: make and remove a folder there
        _probe(probe, what=what, make=os.mkdir, undo=os.rmdir, why="cannot be created", target=path)


def _probe(where: Path, *, what: str, make, undo, why: str, target: Path | None = None) -> None:
    """Make and remove one entry in ``where``: permission bits do not tell (root passes them, a
    read-only mount or /proc does not take the write)."""
    name = where / f".mlafuzz-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        make(name)
    except OSError as exc:
        shown = target if target is not None else where
        inside = f" (in {where})" if target is not None else ""
        raise RunDirError(f"{what} {shown}: {why}{inside}: {exc.strerror or exc}") from None
    undo(name)


def clear_run(path: Path) -> list[str]:
    """Remove an earlier run's own files from ``path`` (see the module docstring); the names removed."""
    path = Path(path)
    removed = []
    for name in RUN_FILES:
        if (path / name).is_file():
            (path / name).unlink()
            removed.append(name)
    bundles = path / BUNDLES_DIR
    if bundles.is_dir():
        for child in sorted(bundles.iterdir()):
            if child.is_dir() and (child / "case.json").is_file():
                shutil.rmtree(child)
                removed.append(f"{BUNDLES_DIR}/{child.name}")
        if not any(bundles.iterdir()):
            bundles.rmdir()
    for child in path.iterdir() if path.is_dir() else ():
        if child.is_file() and temporary_of(child.name) in RUN_FILES:
            child.unlink()
    return removed
