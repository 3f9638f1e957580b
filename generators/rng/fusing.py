"""Where the torch builders find the optional fused room (generators/fused).

``fused_room(device)`` is the room's kernels module when it may make a case's tensors on that
device, else None: switched off, no Triton, the wrong device, or the room deleted (only speed is
lost: the torch builders make the same bytes).
"""

from __future__ import annotations

from types import ModuleType

import torch

try:
    from mlafuzz.generators.fused import room as fused_room
except ImportError:  # the room was deleted

    def fused_room(device: torch.device | str) -> ModuleType | None:
        return None


__all__ = ["fused_room"]
