"""The fast path's check of convert (the op row's ``fast``): both runs' outputs through the fused
kernel of harness/fast/convert_rows.py (recomputed slots and valid counts, one pass, one launch).

Caller-owned outputs (SPEC 9.2: ``out=`` / ``valid_counts_out=``, row slices of guarded buffers,
one or two steps): ``prefill`` fills them before each call so that no element holds a value its
row expects, in any order, nor a count its own or the count added into it; a pass of the last
step's outputs then means every element was written right, as the full path's two-run write map
and comparator establish. The path checks the guard zones (the buffer's other rows); ``check``
holds each returned tensor to being the buffer the call was given (on the host), and a re-run's
compacted rows to the first run's bytes (the write map's NONDETERMINISM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.convert_rows import convert_prefill, convert_rows_flag
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.memory.guards import Guarded
from mlafuzz.harness.ops.convert import compacts, is_view_of
from mlafuzz.harness.ops.convert import oracle_inputs as _inputs
from mlafuzz.harness.ops.op import Outputs

__all__ = ["RERUNS", "check", "convert_prefill", "convert_rows_flag", "prefill", "takes"]

_MEMO = "convert"


# The fast path hands this check a re-run's outputs (plain cases too) and needs no bit-for-bit
# comparison of the two runs beside it: both are judged against the oracle in one launch.
RERUNS = True


@dataclass(frozen=True)
class _Callers:
    """What the prefills of a case's calls leave for its check: each call's caller-owned buffers
    (in call order)."""

    guards: list[Mapping[str, Guarded]]


def prefill(case: Case, guards: Mapping[str, Guarded], state: CaseState) -> bool:
    """Before each call of a case with caller-owned outputs (SPEC 9.2): its ``out`` and
    ``valid_counts_out`` prefilled (``convert_prefill``), and the buffers kept for ``check``. The
    prefill's "cannot tell" goes straight into the check's second slot on the board (made before
    the calls: ``CaseState.slots``), no flag and copy of its own."""
    if "out" not in guards:
        return False
    counts = guards.get("valid_counts")
    memo = state.memo.setdefault(_MEMO, _Callers(guards=[]))
    done = convert_prefill(
        out=guards["out"].view,
        valid_counts=counts.view if counts is not None else None,
        undecided=state.slots[1:2],
        launchers=state.launchers,
        **_inputs(case),
    )
    if done:
        memo.guards.append(guards)
    return done


def takes(case: Case) -> bool:
    """Every case: caller-owned outputs (SPEC 9.2) too, through ``prefill``, and vLLM's release
    arguments (SPEC 10: ``idx_mapping``, the DCP arguments), which the fused kernel computes."""
    return True


def _callers_own(runs: list[Outputs], memo: _Callers | None) -> bool:
    """Each call returned the very buffers it was given (SPEC 9.2; the full path's
    ``out:not_callers``): same address, shape, strides and dtype, read on the host."""
    if memo is None or len(memo.guards) != len(runs):
        return False
    return all(is_view_of(o.get(name), g.view) for o, gs in zip(runs, memo.guards) for name, g in gs.items())


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    """The fast path's check of a convert call: each run's ``out`` and ``valid_counts`` (``second``:
    the re-run's, when one was made) against the oracle's, in one launch. With caller-owned
    outputs also: the returned tensors the caller's own, the prefill's flag (already in
    ``flag[1]``), and (compacted rows, whose order is free) the two runs' outputs bit-identical,
    as the write map holds them. A plain case's compacted rows need only each be the oracle's
    multiset, as the full path's re-run compares them (row sets). The guard zones and the two
    steps are the path's and the op's (path.py, ops/convert.py ``invoke``). False: it cannot
    tell from the host, nothing launched."""
    p = case.params
    caller = "out_steps" in p
    runs = [outputs] + ([second] if second is not None else [])
    if caller and not _callers_own(runs, state.memo.get(_MEMO)):
        return False
    wants = ("out", "valid_counts") if p["return_valid_counts"] else ("out",)
    if not all(isinstance(o.get(name), torch.Tensor) for o in runs for name in wants):
        return False
    counts = [o["valid_counts"] if p["return_valid_counts"] else None for o in runs]
    checked = convert_rows_flag(
        out=outputs["out"],
        valid_counts=counts[0],
        second=(second["out"], counts[1]) if second is not None else None,
        same=caller,
        flag=flag,
        launchers=state.launchers,
        compact=compacts(case),  # asked for, or counted under a revision whose rule compacts
        **_inputs(case),
    )
    return checked is not None
