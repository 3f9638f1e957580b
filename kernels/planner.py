"""Our packing chunk planner (SPEC.md section 9.1), written from the SPEC alone, as an implementation
under test of the ``plan`` op (registered as ``ours`` and ``python``).

``plan_context_chunks(context_lens, row_budget, max_context_chunk, split_alignment, padded_rows)``
returns a list of ``ContextChunk`` (request_start, request_end, starts, seq_lens,
is_continuation), the shape vLLM's ``plan_mla_context_chunks`` returns. Pure Python: the plan is
host metadata. The split length is found by a binary search over the number of aligned pieces
(the rows of a prefix grow with its length, so the pieces that fit are a prefix of 0..k_max).

Stages are methods so the planted-bug mutants (kernels/mutants/planner_bugs.py) override one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mlafuzz.kernels.entry import ImplEntry, module_attr

__all__ = ["ContextChunk", "Planner", "plan_context_chunks", "PLAN_ENTRIES"]


@dataclass
class ContextChunk:
    request_start: int
    request_end: int
    starts: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    is_continuation: bool = False


class Planner:
    """The planner of SPEC 9.1; each mutant overrides one stage."""

    def rows(self, padded_rows: Callable[[int], int], start: int, length: int) -> int:
        """Workspace rows of context [start, start + length) (rank-local rows under DCP)."""
        return padded_rows(start + length) - padded_rows(start)

    def fits(self, used: int, more: int, budget: int) -> bool:
        return used + more <= budget

    def ends_chunk(self, context_len: int) -> bool:
        """A request with no context belongs to no chunk and closes the current one."""
        return context_len == 0

    def split_len(
        self, *, start: int, remaining: int, free: int, cap: int, align: int, padded_rows: Callable[[int], int]
    ) -> int:
        """The longest aligned prefix of what is left that fits ``free`` rows, leaves a token and
        is at most ``cap`` (0 when none does)."""
        k_hi = min(cap, (remaining - 1) // align * align) // align
        lo, hi = 0, max(k_hi, 0)  # invariant: lo pieces fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.rows(padded_rows, start, mid * align) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo * align

    def __call__(
        self,
        context_lens: list[int],
        row_budget: int,
        max_context_chunk: int,
        split_alignment: int,
        padded_rows: Callable[[int], int],
    ) -> list[ContextChunk]:
        if row_budget < 1 or split_alignment < 1 or max_context_chunk < 1:
            raise ValueError(
                f"row_budget={row_budget}, max_context_chunk={max_context_chunk}, split_alignment={split_alignment}:"
                " each must be >= 1"
            )
        lens = [int(c) for c in context_lens]
        chunks: list[ContextChunk] = []
        current: ContextChunk | None = None
        used = 0
        r, offset = 0, 0  # the request being placed, and how much of it earlier chunks took
        while r < len(lens):
            if lens[r] == 0:  # in no chunk
                if self.ends_chunk(lens[r]):
                    current = None
                r += 1
                continue
            if current is None:
                current, used = ContextChunk(request_start=r, request_end=r), 0
                chunks.append(current)
            left = lens[r] - offset
            need = self.rows(padded_rows, offset, left)
            if self.fits(used, need, row_budget):
                take, done = left, True
            else:
                take = self.split_len(
                    start=offset,
                    remaining=left,
                    free=row_budget - used,
                    cap=max_context_chunk,
                    align=split_alignment,
                    padded_rows=padded_rows,
                )
                done = False
            if take > 0:
                current.starts.append(offset)
                current.seq_lens.append(take)
                current.request_end = r + 1
                used += self.rows(padded_rows, offset, take)
            elif not current.seq_lens:
                raise ValueError(
                    f"request {r} (context {lens[r]}, from {offset}) fits no chunk: row_budget={row_budget}"
                    f" holds no piece of split_alignment={split_alignment}"
                )
            if done:
                r, offset = r + 1, 0
            else:
                offset += take
                current = None  # a split closes the chunk; the request goes on in the next one
        for c in chunks:
            c.is_continuation = bool(c.starts) and c.starts[0] > 0
        return chunks


plan_context_chunks = Planner()


def _entry(name: str, description: str) -> ImplEntry:
    return ImplEntry(
        op="plan",
        name=name,
        loader=module_attr(__name__, "plan_context_chunks"),
        devices=frozenset({"cpu", "cuda"}),
        rejects=frozenset(),
        description=description,
    )


PLAN_ENTRIES: tuple[ImplEntry, ...] = (
    _entry("ours", "our packing chunk planner (pure Python, written from docs/contract.md's plan)"),
    _entry("python", "our packing chunk planner (pure Python, written from docs/contract.md's plan); the same as ours"),
)
