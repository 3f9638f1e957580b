"""The fast path's state: one ``Resources`` per process, one ``CaseState`` per case checked.

Resources hold what is worth keeping between cases (the compiled launches, which
ops' checks failed, the host copies' buffers);
a CaseState what one case's calls share (its input fingerprints, the fused
gather check's row -> record map), dropped with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.launch import Launchers


class Resources:
    def __init__(self) -> None:
        self.launchers = Launchers()
        self.failed: set[str] = set()  # ops whose fast check raised (warned once, then the full path)
        self._held: dict[str, torch.Tensor] = {}  # per input name: host bytes reused case after case

    def hold(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A host copy of ``t`` (a host tensor) in a buffer kept for ``name``: a fresh clone of a
        few MB costs about 1 ms of page faults a case, a reused buffer a fifth of that. Valid until
        the next case holds ``name``."""
        buf = self._held.get(name)
        if buf is None or buf.numel() < t.nbytes:
            buf = self._held[name] = torch.empty(max(t.nbytes, 1 << 20), dtype=torch.uint8)
        return buf[: t.nbytes].view(t.dtype).view(t.shape).copy_(t)


@dataclass
class CaseState:
    case: Case
    res: Resources
    # The fused check's two board slots as the snapshot holds them before the calls (int64 [2] on
    # the device): what a prefill sets there is on the board the check later writes into.
    slots: torch.Tensor
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def launchers(self) -> Launchers:
        return self.res.launchers
