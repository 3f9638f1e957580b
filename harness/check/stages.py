"""Named stages of a check, for torch.profiler: ``with stage("oracle"): ...``.

``mlafuzz bench --harness`` profiles a check and reads each stage's time off
the profiler's table; outside a profiler a stage costs well under a
microsecond (torch's fast record-function when this torch has it).
"""

from __future__ import annotations

from typing import ContextManager

import torch

try:  # a C++ scope, ~0.3 us, where torch.autograd.profiler.record_function costs several
    from torch._C._profiler import _RecordFunctionFast as _Fast
except ImportError:  # older torch
    _Fast = None

PREFIX = "mlafuzz::"


def stage(name: str) -> ContextManager:
    """The profiler scope ``mlafuzz::<name>``."""
    if _Fast is not None:
        return _Fast(PREFIX + name)
    return torch.autograd.profiler.record_function(PREFIX + name)
