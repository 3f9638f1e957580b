"""Atomic file writes (temp file in the same folder, then rename): a file is whole or absent.

Every file the harness writes (summary.json, run.json, bundles, reports) goes
through here, or is opened plainly (findings.jsonl), so all of them get one
mode: 0666 less the user's umask, as any file a tool creates. The temporary
file is opened with that mode and ``O_EXCL`` instead of ``mkstemp`` (which
makes 0600 files: a CI artifact's summary.json then could not be read by the
job that downloads it, while its findings.jsonl could). The folder must exist:
writing a report to a mistyped path must not create it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE_MODE = 0o666  # the kernel takes the umask off, as for open(path, "w")


def atomic_write(path: Path, data: str | bytes) -> None:
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    for _ in range(100):  # a name collision is astronomically rare; never loop forever
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"atomic_write: no free temporary name next to {path}")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def temporary_of(name: str) -> str | None:
    """The file whose atomic_write left the temporary file ``name`` behind (a run killed mid-write),
    or None when ``name`` is not one of them."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    target, sep, token = name[1 : -len(".tmp")].rpartition(".")
    return target if sep and len(token) == 12 else None
