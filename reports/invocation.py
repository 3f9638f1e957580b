"""The command a printed line starts with: the executable the user ran, so a repro, replay or
hint line pasted into a shell (from the folder the run started in) runs as printed.

``.venv/bin/mlafuzz fuzz ...`` prints ``.venv/bin/mlafuzz replay ...``; ``mlafuzz`` found on
PATH prints ``mlafuzz``; ``python -m mlafuzz.harness.cli`` prints that interpreter's ``-m`` line.
A process that is not the CLI (the pytest plugin, a script calling the campaign) names the
console script beside its interpreter. Spawned workers see their parent's ``sys.argv``
(multiprocessing hands it over), so they decide the same.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

SCRIPT = "mlafuzz"
MODULES = ("mlafuzz.harness.cli", "mlafuzz.harness.cli.main", "mlafuzz.harness.cli.__main__")


def _shown(path: Path) -> str:
    """``path`` as a user would type it: bare when PATH finds this very file, else relative to
    the working folder when it lies below it, else absolute. Links are not followed: a venv's
    ``python`` is a link to the system's, and only the link knows the venv."""
    full = os.path.abspath(path)
    on_path = shutil.which(path.name)
    if on_path and os.path.abspath(on_path) == full:
        return path.name
    here = os.getcwd()
    return os.path.relpath(full, here) if full.startswith(here + os.sep) else full


def _main_module() -> str | None:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    return name if name in MODULES else None


def command_words() -> list[str]:
    """The words of the command that runs mlafuzz the way this process was started."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name == SCRIPT and Path(argv0).is_file():
        if os.sep not in argv0:
            return [SCRIPT]
        return [argv0] if not os.path.isabs(argv0) else [_shown(Path(argv0))]
    python = _shown(Path(sys.executable)) if sys.executable else "python3"
    module = _main_module()
    if module is not None:
        return [python, "-m", module.removesuffix(".__main__")]
    beside = Path(sys.executable).parent / SCRIPT if sys.executable else None
    if beside is not None and beside.is_file():
        return [_shown(beside)]
    return [python, "-m", "mlafuzz.harness.cli"]


def command(*words: str) -> str:
    """``command("replay", path)``: the whole line, quoted for a POSIX shell."""
    return " ".join(shlex.quote(w) for w in (*command_words(), *words))
