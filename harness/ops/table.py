"""The op table: every op mlafuzz knows, one row each (see op.py).

Adding an op: its inputs in generators/ops/<op>.py, its oracle in oracles/,
its implementations in kernels/, its row in harness/ops/<op>.py, and one line
here. Nothing registers itself on import; whatever needs the ops reads OPS
(or a table a caller builds, such as a test's toy op: ``OPS.with_op(...)``).
"""

from __future__ import annotations

from mlafuzz.harness.ops.convert import CONVERT
from mlafuzz.harness.ops.dcp import DCP, DCP_PEER
from mlafuzz.harness.ops.gather import GATHER
from mlafuzz.harness.ops.names import NAMES
from mlafuzz.harness.ops.nvfp4.gather import NVFP4_GATHER
from mlafuzz.harness.ops.nvfp4.writer import NVFP4_WRITER
from mlafuzz.harness.ops.op import Op, OpTable, Outputs
from mlafuzz.harness.ops.plan import PLAN
from mlafuzz.harness.ops.step import STEP
from mlafuzz.harness.ops.writer import WRITER

OPS = OpTable((CONVERT, GATHER, WRITER, STEP, PLAN, DCP, DCP_PEER, NVFP4_GATHER, NVFP4_WRITER))

if OPS.names != NAMES:  # names.py is what --help shows without importing torch
    raise ImportError(f"harness/ops/names.py says {NAMES}, the op table holds {OPS.names}")


__all__ = ["OPS", "Op", "OpTable", "Outputs"]
