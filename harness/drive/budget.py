"""A budget is a promise: how a run's ``--budget`` is split between cases, a grace and shrinking.

A CI job sized by ``--budget`` must not be killed by its own timeout, so a budget run ends within
the budget plus a short grace, whatever the implementation does:

- Cases start until the budget ends; once a new bucket waits to be shrunk, until ``shrink``
  seconds before it (the shrink reserve: ``--shrink-budget``, at most ``SHRINK_SHARE`` of the
  budget), so its shrinking happens inside the budget.
- A case still running when cases stop gets ``grace`` more seconds (the smaller of ``--timeout``
  and ``GRACE_SECONDS``), then it is cut: counted as unfinished and kept for ``--resume``, never
  a TIMEOUT (it did not have its whole ``--timeout``).
- Shrinking, and the loop oracle's check of a shrunk case, end when the budget does; a bucket
  found with no time left keeps its bundle as found.

Without an executor that can cut a running case (``--in-process``: no ``timeout``), there is no
grace to promise: a hanging call there hangs the run.
"""

from __future__ import annotations

from dataclasses import dataclass

GRACE_SECONDS = 3.0  # what a case running when cases stop may still take (a hang is then cut)
SHRINK_SHARE = 0.25  # the most of a budget held back for shrinking new buckets


@dataclass(frozen=True, kw_only=True)
class BudgetPlan:
    """The split of one session's budget (seconds from its start)."""

    total: float
    grace: float | None  # None: running cases cannot be cut (in-process)
    shrink: float  # the shrink reserve (0: no shrinking)

    @classmethod
    def of(cls, *, budget: float, timeout: float | None, shrink_budget: float) -> BudgetPlan:
        grace = None if timeout is None else min(timeout, GRACE_SECONDS)
        return cls(total=budget, grace=grace, shrink=min(shrink_budget, budget * SHRINK_SHARE))

    def cases_until(self, *, shrinking: bool) -> float:
        """When cases stop starting: the budget's end, or the shrink reserve's start once a new
        bucket waits to be shrunk."""
        return self.total - (self.shrink if shrinking else 0.0)

    def cut_at(self, stopped: float) -> float | None:
        """When the cases still running after cases stopped at ``stopped`` are cut (None: never)."""
        return None if self.grace is None else stopped + self.grace

    def facts(self) -> dict[str, float | None]:
        """What the header's budget line says (reports/console.py ``budget_line``)."""
        return {"total": self.total, "grace": self.grace, "grace_cap": GRACE_SECONDS, "shrink": self.shrink}
