"""How a case's tensors sit in memory: the views vLLM's call sites pass (SPEC 8).

A kernel is called on slices, not on fresh contiguous tensors: a block
table that is a column slice of a wider buffer (row stride > its width) or a
row slice of a taller one (a non-zero storage offset), rows of a larger
step tensor. ``placed`` builds such a view: the tensor's values inside a
larger base whose other elements are ``junk`` (plausible values, so a kernel
that reads outside its view reads something wrong, never something that
crashes it). The view keeps its base alive; Case.cloned_tensors copies the
base and re-makes the view, so the full path's copies keep the layout too.
"""

from __future__ import annotations

from torch import Tensor

from mlafuzz.generators.rng.pool import POOL_WORDS, Draws, windows
from mlafuzz.generators.spec import View

__all__ = ["placed", "slack", "table_view"]

# Slack around a view, by kind: a small set, so guard-zone layouts stay few (the fast path caches
# one fingerprint per layout). Rows before, rows after, extra columns (a negative entry: that many
# times the width).
ROWS_BEFORE = (1, 2, 7)
ROWS_AFTER = (0, 1, 5)
EXTRA_COLS = (1, 3, 16, -1)


def slack(view: View, *, draws: Draws, width: int) -> tuple[int, int, int]:
    """(rows before, rows after, extra columns) of a view of ``view``'s kind, picked by a host int
    of ``draws`` (asked only for a view that has slack: a plain one costs no hash); ``width`` is the
    tensor's column count."""
    if view is View.PLAIN:
        return 0, 0, 0
    pick = draws.host_int(1 << 30)
    if view is View.ROWS:
        return ROWS_BEFORE[pick % 3], ROWS_AFTER[(pick // 3) % 3], 0
    extra = EXTRA_COLS[pick % len(EXTRA_COLS)]  # View.COLUMNS
    return 0, 0, extra if extra > 0 else max(1, width)


def placed(t: Tensor, *, junk: Tensor, before: int, cols: int) -> Tensor:
    """``t`` ([R, M] or [R]) copied into ``junk`` (the base: [before + R + after, M + cols] or
    [before + R + after]) at rows [before, before + R) and columns [0, M); returns that view."""
    rows = slice(before, before + t.shape[0])
    if t.dim() == 1:
        junk[rows] = t
        return junk[rows]
    junk[rows, : t.shape[1]] = t
    return junk[rows, : t.shape[1]]


def table_view(table: Tensor, view: View, *, draws: Draws, num_blocks: int) -> Tensor:
    """``table`` (int32 [R, M]) as the view ``view`` names, inside a base of random block ids in
    [0, num_blocks) (a kernel reading past its view reads valid, wrong blocks)."""
    if view is View.PLAIN:
        return table
    before, after, cols = slack(view, draws=draws, width=table.shape[1])
    rows, width = before + table.shape[0] + after, table.shape[1] + cols
    junk = windows(draws.words(rows, device=table.device) & (POOL_WORDS - 1), width, device=table.device)
    return placed(table, junk=junk % max(num_blocks, 1), before=before, cols=cols)
