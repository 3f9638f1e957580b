"""The fast path's check of dcp_peer (the op row's ``fast``): both runs' ``out`` and ``valid_counts``
against the vectorized oracle (oracles/dcp.py ``dcp_peer_slots``), computed on the case's device
with whole-tensor torch ops and compared there, the verdict written into the board with no sync.

No Triton kernel of its own: the oracle is ~25 launches, the comparison five, so a case costs a
fraction of the full path's input clones, copied run, oracle, comparator and detectors.

Caller-owned outputs (SPEC 9.2: ``out=`` / ``valid_counts_out=``, row slices of guarded buffers,
one or two steps): ``prefill`` leaves the guarded fill in place when its int32 word is already a value no
correct result holds (decided on the host, nothing launched), else fills the view with one
that is. A peer slot lies in ``[0, D * blocks_per_peer * bs)`` (the host check keeps that within
int32), so every correct ``out`` element is -1 or in that range and every correct count in
``[0, K]``: an element a call never wrote, or a count added into the fill instead of written,
cannot pass. ``check`` then holds each returned tensor to being the buffer
the call was given; both runs equal to the oracle means they are bit-identical too (the write
map's NONDETERMINISM). No compaction: every row is compared element by element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.memory.guards import Guarded
from mlafuzz.harness.ops.convert import is_view_of
from mlafuzz.harness.ops.dcp import peer_slots
from mlafuzz.harness.ops.op import Outputs

__all__ = ["RERUNS", "check", "prefill", "takes"]

_MEMO = "dcp_peer"

# The check judges a re-run's outputs itself (against the oracle, in the same comparison), so the
# path makes no bit-for-bit comparison of the two runs beside it.
RERUNS = True


@dataclass(frozen=True)
class _Callers:
    """Each call's caller-owned buffers, in call order, for ``check``."""

    guards: list[Mapping[str, Guarded]]


def _word(fill: int) -> int:
    """The int32 value of a 4-byte word of the byte ``fill``."""
    return int.from_bytes(bytes([fill] * 4), "little", signed=True)


def _tells(word: int, *, name: str, k: int, space: int) -> bool:
    """Whether an int32 ``word`` in the caller's ``name`` tells an element never written: no correct
    slot (-1 or in ``[0, space)``) or count (``[0, K]``, also once up to two counts were added into
    it by a call that adds instead of storing)."""
    if name == "out":
        return word < -1 or word >= space
    return word < -(2 * k + 1) or k < word < 2**31 - 2 * k


def prefill(case: Case, guards: Mapping[str, Guarded], state: CaseState) -> bool:
    """Before each call with caller-owned outputs: the buffers' fill left in place where its word
    already tells an unwritten element (decided on the host, nothing launched), else the view
    filled with int32's least value, which always does (see ``_tells``). False (the full path
    judges): the peer view's slots do not fit int32 (no value is then safe)."""
    p = case.params
    space = p["dcp_size"] * p["blocks_per_peer"] * p["block_size"]
    if "out" not in guards or space >= 2**31:
        return False
    k = case.tensors["token_indices"].shape[1]
    if any(g.view.dtype != torch.int32 for g in guards.values()):
        return False
    for name, g in guards.items():
        if not _tells(_word(g.fill), name=name, k=k, space=space):
            g.view.fill_(-(2**31))
    state.memo.setdefault(_MEMO, _Callers(guards=[])).guards.append(guards)
    return True


def takes(case: Case) -> bool:
    """Every case: caller-owned outputs too, through ``prefill``."""
    return True


def _callers_own(runs: list[Outputs], memo: _Callers | None) -> bool:
    """Each call returned the very buffers it was given (the full path's ``out:not_callers``)."""
    if memo is None or len(memo.guards) != len(runs):
        return False
    return all(is_view_of(o.get(name), g.view) for o, gs in zip(runs, memo.guards) for name, g in gs.items())


def _row(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` flattened end to end: a view where there is one contiguous part, else one launch."""
    return parts[0].reshape(-1) if len(parts) == 1 else torch.cat([t.reshape(-1) for t in parts])


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    """Each run's ``out`` (and ``valid_counts`` when asked for) against the oracle's, on the device:
    ``flag[0]`` set to 1 where any element differs. ``flag[1]`` (the caller-owned "cannot tell"
    slot) is left as it is: the prefill decides on the host. False, nothing launched: it cannot
    tell (a returned tensor of another shape, dtype or device, or not the caller's buffer)."""
    p = case.params
    runs = [outputs] + ([second] if second is not None else [])
    if "out_steps" in p and not _callers_own(runs, state.memo.get(_MEMO)):
        return False
    ti = case.tensors["token_indices"]
    n, k = ti.shape
    shapes = {"out": (n, k), **({"valid_counts": (n,)} if p["return_valid_counts"] else {})}
    for o in runs:
        for name, shape in shapes.items():
            t = o.get(name)
            if not (
                isinstance(t, torch.Tensor)
                and tuple(t.shape) == shape
                and t.dtype == torch.int32
                and t.device == ti.device
            ):
                return False
    if n * k == 0 and not p["return_valid_counts"]:
        return True  # nothing to compare: the slot stays 0
    out, counts = peer_slots(case, loop=False)
    # One row per run of every compared element (out, then the counts), against the oracle's:
    # at most two concatenations, one comparison, one reduction, one write into the board.
    got = _row([o[name] for o in runs for name in shapes]).view(len(runs), -1)
    want = _row([out] + ([counts] if p["return_valid_counts"] else []))
    flag[0:1].copy_(got.ne(want).any().reshape(1))
    return True
