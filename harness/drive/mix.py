"""The op mix of a run: which op case i is, and the how-many-th case of that op it is.

An op's cost per case differs up to 9x between ops (docs/performance.md), so equal case counts
spent a run's time on its slowest ops. Each op row holds a ``share`` (about its cases per second
relative to the others), and a run's case indices come in rounds of sum(shares): op j takes
share_j of each round's slots: every op once at the round's start (so any len(ops) consecutive
cases from a round's start see every op), the rest spread through it by smooth weighted
round-robin (nginx's). The round is computed once;
case i's op and its own count stay pure functions of i, which resume, shards, bundles and replay
rely on. Shares are divided by their greatest common divisor, so one op alone, or ops of equal
shares, give exactly the equal rounds of one case per op that runs made before shares existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True, kw_only=True)
class Mix:
    ops: tuple[str, ...]
    shares: tuple[int, ...]  # reduced by their gcd: the slots of each op in one round
    slots: tuple[int, ...] = field(init=False, repr=False)  # the op (index into ops) of each slot
    before: tuple[int, ...] = field(init=False, repr=False)  # slots of the same op earlier in the round

    def __post_init__(self) -> None:
        if not self.ops or len(self.shares) != len(self.ops):
            raise ValueError(f"Mix: ops={self.ops!r} and shares={self.shares!r} must pair up, at least one")
        bad = [
            (op, s) for op, s in zip(self.ops, self.shares) if isinstance(s, bool) or not isinstance(s, int) or s < 1
        ]
        if bad:
            raise ValueError(f"Mix: share={bad[0][1]!r} of op {bad[0][0]!r} must be a whole number >= 1")
        divisor = math.gcd(*self.shares)
        shares = tuple(s // divisor for s in self.shares)
        # Every op once first, in the table's order, so any run of len(ops) cases or more sees every
        # op (a short --cases run, a budget that ends early); then the rest of each op's share,
        # spread out by smooth weighted round-robin.
        slots = list(range(len(shares)))
        rest = [s - 1 for s in shares]
        total, current = sum(rest), [0] * len(shares)
        for _ in range(total):  # op j lands rest_j more times; an op with none left is never picked
            for j, s in enumerate(rest):
                current[j] += s
            pick = max(range(len(rest)), key=lambda j: (current[j], -j))  # ties: the table's order
            current[pick] -= total
            slots.append(pick)
        seen = [0] * len(shares)
        before = []
        for j in slots:
            before.append(seen[j])
            seen[j] += 1
        object.__setattr__(self, "shares", shares)
        object.__setattr__(self, "slots", tuple(slots))
        object.__setattr__(self, "before", tuple(before))

    @classmethod
    def of(cls, ops: tuple[str, ...], shares: Mapping[str, int]) -> Mix:
        return cls(ops=tuple(ops), shares=tuple(shares[op] for op in ops))

    @property
    def size(self) -> int:
        """Case indices in one round."""
        return len(self.slots)

    def op(self, i: int) -> str:
        return self.ops[self.slots[i % self.size]]

    def own(self, i: int) -> int:
        """How many cases of case i's op come before it in the run (its op's own case count)."""
        j = self.slots[i % self.size]
        return (i // self.size) * self.shares[j] + self.before[i % self.size]

    def to_json(self) -> dict[str, int]:
        return dict(zip(self.ops, self.shares))
