"""Planted bugs in the packing chunk planner (SPEC.md section 9.1): each overrides one stage of our
planner (kernels/planner.py) with a realistic mistake. Every one draws METADATA_MISMATCH: a plan
that is not the rule's, or breaks one of its invariants."""

from __future__ import annotations

from typing import Callable

from mlafuzz.kernels.entry import ImplEntry, module_attr
from mlafuzz.kernels.planner import Planner

__all__ = ["PLANNER_MUTANTS"]


class UnalignedSplit(Planner):
    """The split takes the longest prefix that fits, not the longest aligned one: the next chunk's
    continuation starts off the split alignment (off a block, or off a rank's interleave)."""

    def split_len(self, *, start, remaining, free, cap, align, padded_rows) -> int:
        return super().split_len(start=start, remaining=remaining, free=free, cap=cap, align=1, padded_rows=padded_rows)


class ZeroContextJoins(Planner):
    """A request with context 0 is skipped but does not end the chunk: the chunk's request range
    then spans a request it holds no slice of."""

    def ends_chunk(self, context_len: int) -> bool:
        return False


class PaddingIgnored(Planner):
    """Rank-local rows counted as the context shared evenly over the ranks, ``ceil(n / D)``, with
    padded_rows ignored: the interleave padding is left out, so a chunk under DCP can hold more
    rows than the budget (a short context still takes a whole interleave block on a rank)."""

    def __init__(self, world: Callable[[Callable[[int], int]], int]) -> None:
        self.world = world

    def rows(self, padded_rows: Callable[[int], int], start: int, length: int) -> int:
        return -(-length // self.world(padded_rows))


def _world_size(padded_rows: Callable[[int], int]) -> int:
    """D, as the bug's author reads it off padded_rows: the tokens of a long context over its rows
    (padded_rows(r) = ceil(r / (D*I)) * I, so 2**20 tokens give 2**20 / D rows for D*I <= 2**20)."""
    rows = padded_rows(1 << 20)
    return max(1, round((1 << 20) / rows)) if rows else 1


class NoMaxChunk(Planner):
    """max_context_chunk ignored when splitting (only reachable where it is below the budget)."""

    def split_len(self, *, start, remaining, free, cap, align, padded_rows) -> int:
        return super().split_len(
            start=start, remaining=remaining, free=free, cap=1 << 62, align=align, padded_rows=padded_rows
        )


plan_unaligned_split = UnalignedSplit()
plan_zero_context_joins = ZeroContextJoins()
plan_padding_ignored = PaddingIgnored(lambda padded: _world_size(padded))
plan_no_max_chunk = NoMaxChunk()

_BUGS = {
    "plan_unaligned_split": "a split continuation starts off split_alignment (the longest prefix that fits, unaligned)",
    "plan_zero_context_joins": "a request with context 0 does not end the chunk (the chunk spans it)",
    "plan_padding_ignored": "DCP rows counted as ceil(tokens / D): padded_rows (the interleave padding) ignored",
    "plan_no_max_chunk": "max_context_chunk ignored when a request is split",
}

PLANNER_MUTANTS: tuple[ImplEntry, ...] = tuple(
    ImplEntry(
        op="plan",
        name=name,
        loader=module_attr(__name__, name),
        devices=frozenset({"cpu", "cuda"}),
        rejects=frozenset(),
        description=text,
        expected_kind="METADATA_MISMATCH",
        is_mutant=True,
        group="planner",
    )
    for name, text in _BUGS.items()
)
