"""The fast path's check of dcp (the op row's ``fast``): both runs' ``out`` and ``valid_counts``
against the vectorized filter oracle (oracles/dcp.py ``dcp_filter``), computed on the case's
device with whole-tensor torch ops and compared there, the verdict written into the board with no
sync.

No Triton kernel of its own: the oracle is ~20 launches, the comparison under ten, so a case costs
a fraction of the full path's input clones, copied run, oracle, comparator and detectors. No
caller-owned outputs (the row guards none): the outputs are the implementation's own.

A compacted case (harness/ops/dcp.py ``compacts``: ``compact_valid_to_front`` at D > 1; at D = 1
vLLM's hand-off to the plain convert, a counted row under ``convert_counted = compact``) is judged as the full path's row-set mode judges it
(harness/check/compare.py, oracles/convert.py ``rows_as_sets_equal``): row i's first ``c_i``
values (``c_i`` the oracle's count) a multiset equal to the oracle's valid values, -1 in every
later column. Here that is: the row's columns from ``c_i`` on all -1, and the whole row, sorted,
equal to the oracle's uncompacted row, sorted. The uncompacted row holds the same valid values
plus ``K - c_i`` -1s, and a got row whose tail is ``K - c_i`` -1s holds exactly its prefix plus
those, so the two sorted rows agree exactly when the prefixes agree as multisets (a valid value
that wrapped to -1 is counted on both sides alike). The oracle is asked uncompacted: its
compaction would be five more launches for the same sorted rows. Two runs both equal to the oracle
so also agree row by row as multisets: the full path's re-run check (``rerun_pairs``, rows sorted).
"""

from __future__ import annotations

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.ops.dcp import compacts, filter_slots
from mlafuzz.harness.ops.op import Outputs

__all__ = ["RERUNS", "check"]

# The check judges a re-run's outputs itself (against the oracle, in the same comparison), so the
# path makes no bit-for-bit comparison of the two runs beside it (which would see two compacted
# rows in different orders as different: the full path compares them as multisets).
RERUNS = True


def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` (one per run, one shape) stacked on a new first dim: a view for one run."""
    return parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts)


def _fits(t: object, shape: tuple[int, ...], device: torch.device) -> bool:
    return isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == torch.int32 and t.device == device


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    """Each run's ``out`` (and ``valid_counts`` when asked for) against the oracle's, on the device:
    ``flag[0]`` set to 1 where any differs (a compacted ``out`` row by row as a multiset with a
    -1 tail). ``flag[1]`` is left as it is (no caller-owned outputs). False, nothing launched: it
    cannot tell (a returned tensor of another shape, dtype or device: the full path names it)."""
    p = case.params
    runs = [outputs] + ([second] if second is not None else [])
    ti = case.tensors["token_indices"]
    n, k = ti.shape
    counted = bool(p["return_valid_counts"])
    shapes = {"out": (n, k), **({"valid_counts": (n,)} if counted else {})}
    if not all(_fits(o.get(name), shape, ti.device) for o in runs for name, shape in shapes.items()):
        return False
    if n * k == 0 and not counted:
        return True  # nothing to compare: the slot stays 0
    want, counts = filter_slots(case, loop=False, compact=False)  # uncompacted: the module docstring
    got = _stack([o["out"] for o in runs])  # [runs, N, K]
    if compacts(case):
        # Columns at or past the oracle's count must hold -1; the rows, sorted, the oracle's values.
        tail = torch.arange(k, device=ti.device) >= counts.unsqueeze(1)  # [N, K]
        bad = [got.sort(dim=-1).values.ne(want.sort(dim=-1).values), got.ne(-1) & tail]
    else:
        bad = [got.ne(want)]
    if counted:
        bad.append(_stack([o["valid_counts"] for o in runs]).ne(counts))
    # One concatenation, one reduction, one write into the board.
    flag[0:1].copy_(torch.cat([b.reshape(-1) for b in bad]).any().reshape(1))
    return True
