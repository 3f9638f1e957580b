"""Offline GPU builds in the CPU suite: a Triton kernel compiled for sm_90 on a machine without a
GPU, so a construct the compiler rejects (the interpreter runs only the kernel's Python) fails in
CI, not first on the H200."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Each script starts here: a fresh interpreter with the interpreter mode off, and a skip (not a
# failure) where this Triton has no offline compiler.
PREAMBLE = """\
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as exc:
    print("SKIP", exc)
    sys.exit(0)
"""


def compile_offline(body: str) -> None:
    """Runs PREAMBLE + ``body`` in a subprocess; the body compiles what it checks and prints OK
    last (or SKIP, when a compile raises ImportError). Skips the test on SKIP, fails otherwise
    unless the script exits 0 with OK."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = PREAMBLE + textwrap.dedent(body)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if res.stdout.startswith("SKIP"):
        pytest.skip(f"Triton's offline compiler is unavailable: {res.stdout.strip()}")
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stdout + res.stderr
