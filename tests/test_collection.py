"""The suite collects without Triton (an optional extra): Triton's tests skip, none fails to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# None in sys.modules is how an install without triton looks to `import triton` (ModuleNotFoundError)
# and to importlib.util.find_spec (None), without touching the environment.
_NO_TRITON = """
import sys
sys.modules["triton"] = None
import pytest
sys.exit(pytest.main(["--collect-only", "-q", sys.argv[1]]))
"""


def test_every_test_module_collects_without_triton():
    done = subprocess.run(
        [sys.executable, "-c", _NO_TRITON, str(TESTS)], capture_output=True, text=True, timeout=300, cwd=TESTS.parent
    )
    tail = "\n".join(done.stdout.splitlines()[-15:])
    assert done.returncode == 0, f"collection without triton failed:\n{tail}\n{done.stderr[-2000:]}"
    assert " error" not in done.stdout.splitlines()[-1], tail
    # the Triton modules are there, as skips, not silently dropped: the torch cases of a mixed module stay
    assert "test_convert_refusals.py::" in done.stdout and "test_convert_stride_compact.py::" in done.stdout
