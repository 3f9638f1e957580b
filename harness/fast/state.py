"""The fast path's state: one ``Resources`` per process, one ``CaseState`` per case checked.

Resources hold what is worth keeping between cases (the compiled launches, which
ops' checks failed, the host copies' buffers, which implementations it cannot judge);
a CaseState what one case's calls share (its input fingerprints, the fused
gather check's row -> record map), dropped with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.launch import Launchers

# An implementation whose cases this path runs but cannot judge pays for both paths on each of
# them (a user's step pipeline whose gather calls never match the planned ones: every case with a
# gather). Once this many of its cases were, and they are at least half of those it ran, it goes
# straight to the full path for the rest of the process: a fast run costs over half a full one, so
# past that share it is a loss. The full path judges every case alike, so giving up loses only speed.
GIVE_UP_AFTER = 16


class Resources:
    def __init__(self) -> None:
        self.launchers = Launchers()
        self.failed: set[str] = set()  # ops whose fast check raised (warned once, then the full path)
        self._held: dict[str, torch.Tensor] = {}  # per input name: host bytes reused case after case
        self._tried: dict[tuple[str, str], int] = {}  # (op, impl) -> cases this path ran
        self._wasted: dict[tuple[str, str], int] = {}  # ... of which it could not judge

    def worth_trying(self, key: tuple[str, str]) -> bool:
        """Whether the (op, impl) ``key`` still takes this path (``GIVE_UP_AFTER``)."""
        wasted = self._wasted.get(key, 0)
        return wasted < GIVE_UP_AFTER or 2 * wasted < self._tried.get(key, 0)

    def note(self, key: tuple[str, str], *, ran: bool, wasted: bool) -> None:
        """One case's outcome for ``key``: whether it called the implementation here, and whether it
        was then left to the full path with nothing seen (a case where this path saw a fault is no
        waste: the full path names it). Warns once, when ``key`` is given up."""
        if not ran:
            return
        before = self.worth_trying(key)
        self._tried[key] = self._tried.get(key, 0) + 1
        if wasted:
            self._wasted[key] = n = self._wasted.get(key, 0) + 1
            if before and not self.worth_trying(key):
                import warnings

                warnings.warn(
                    f"the GPU fast path could not judge {n} of {self._tried[key]} cases of {key[0]}={key[1]}"
                    " (their calls or outputs are not the ones it plans for); the full path judges the"
                    " rest alone, which is faster for it",
                    RuntimeWarning,
                    stacklevel=3,
                )

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
