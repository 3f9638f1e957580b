"""The ``plan`` op's inputs (SPEC.md section 9.1): the packing chunk planner's arguments.

A ``PlanSpec`` is the planner's call: the prefill requests' context lengths,
the row budget B, ``max_context_chunk``, ``split_alignment`` and the DCP
world size D and interleave I that make ``padded_rows`` (the identity without
DCP, ``ceil(r / (D*I)) * I`` with it). Two ways to draw one:

- as vLLM's call site derives them from workspace rows W and block size bs:
  ``split_alignment = bs`` (``lcm(bs, D*I)`` under DCP), ``B = W`` (``W // D``)
  and ``max_context_chunk = round_down(W, split_alignment)``;
- directly: B, the alignment and ``max_context_chunk`` each drawn, so that a
  ``max_context_chunk`` below the budget (which the call site never makes)
  is reached too.

Contexts of 0 appear (they end a chunk), as do contexts just under, at and
just over the budget and its multiples. Everything is host ints: the case's
only tensor is ``context_lens`` (int32, on the CPU), and the op costs no
device work.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Iterator

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import SMALL, Drawer, Knobs
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.invalid import InvalidClass
from mlafuzz.generators.reduce import attempt, drop_each, halvings
from mlafuzz.generators.spec import check_int, fail

__all__ = ["PlanSpec", "draw", "materialize", "features", "size", "reduce", "INVALID"]

DCP_WORLD_SIZES = (2, 3, 4, 8)
INTERLEAVES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, kw_only=True)
class PlanSpec:
    """One planner call (SPEC 9.1)."""

    op: ClassVar[str] = "plan"
    context_lens: tuple[int, ...]
    row_budget: int
    max_context_chunk: int
    split_alignment: int
    dcp_world_size: int = 1
    interleave: int = 1  # only with dcp_world_size > 1
    call_site: bool = True  # drawn as vLLM's call site derives the arguments (features only)

    def __post_init__(self) -> None:
        if not isinstance(self.context_lens, tuple) or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in self.context_lens
        ):
            fail("PlanSpec", "context_lens", self.context_lens, "must be a tuple of ints")
        for i, c in enumerate(self.context_lens):
            check_int("PlanSpec", f"context_lens[{i}]", c, lo=0, hi=1 << 24)
        check_int("PlanSpec", "row_budget", self.row_budget, lo=1, hi=1 << 24)
        check_int("PlanSpec", "split_alignment", self.split_alignment, lo=1, hi=1 << 20)
        check_int("PlanSpec", "max_context_chunk", self.max_context_chunk, lo=self.split_alignment, hi=1 << 24)
        check_int("PlanSpec", "dcp_world_size", self.dcp_world_size, lo=1, hi=64)
        check_int("PlanSpec", "interleave", self.interleave, lo=1, hi=1024)
        if self.dcp_world_size == 1 and self.interleave != 1:
            fail("PlanSpec", "interleave", self.interleave, "must be 1 without DCP (dcp_world_size=1)")
        virtual = self.dcp_world_size * self.interleave
        if self.dcp_world_size > 1 and self.split_alignment % virtual:
            fail(
                "PlanSpec",
                "split_alignment",
                self.split_alignment,
                f"must be a multiple of the virtual block D*I={virtual} under DCP",
            )
        if self.piece_rows > self.row_budget:
            fail(
                "PlanSpec",
                "row_budget",
                self.row_budget,
                f"holds no aligned piece ({self.piece_rows} rows of split_alignment={self.split_alignment}):"
                " the planner could not make progress (vLLM asserts)",
            )

    def padded_rows(self, rows: int) -> int:
        if self.dcp_world_size == 1:
            return rows
        return -(-rows // (self.dcp_world_size * self.interleave)) * self.interleave

    @property
    def piece_rows(self) -> int:
        """The rows of one aligned piece (the same from every aligned start)."""
        return self.padded_rows(self.split_alignment)


def call_site(
    *, context_lens: tuple[int, ...], workspace_rows: int, block_size: int, dcp_world_size: int = 1, interleave: int = 1
) -> PlanSpec:
    """The planner's arguments as vLLM's call site derives them (module docstring)."""
    align = block_size if dcp_world_size == 1 else math.lcm(block_size, dcp_world_size * interleave)
    return PlanSpec(
        context_lens=context_lens,
        row_budget=workspace_rows // dcp_world_size,
        max_context_chunk=workspace_rows // align * align,
        split_alignment=align,
        dcp_world_size=dcp_world_size,
        interleave=interleave if dcp_world_size > 1 else 1,
        call_site=True,
    )


def draw(d: Drawer, knobs: Knobs = SMALL) -> PlanSpec:
    """A valid planner call; options are ordered so Hypothesis shrinks towards one request without DCP."""
    dcp = d.boolean()
    world = d.choice(DCP_WORLD_SIZES) if dcp else 1
    inter = d.choice(INTERLEAVES) if dcp else 1
    bs = d.choice((16, 1, 2, 64, 128, 3))
    align = bs if world == 1 else math.lcm(bs, world * inter)
    direct = d.boolean()
    if not direct:
        # vLLM rounds the workspace up to the alignment; also an unrounded one (round_down matters).
        w = align * d.integer(1, 8) + (d.integer(0, align - 1) if d.boolean() else 0)
        budget, mcc = w // world, w // align * align
    else:
        piece = -(-align // (world * inter)) * inter if world > 1 else align
        budget = piece * d.integer(1, 6) + d.integer(0, piece)
        mcc = align * d.integer(1, 6)  # below the budget as often as above it
    scale = max(budget * world, align)
    n = d.integer(1, 2 + 2 * knobs.max_requests)

    def context() -> int:
        kind = d.integer(0, 5)
        if kind == 0:
            return 0
        if kind == 1:
            return d.integer(1, max(1, align))
        if kind == 2:  # at or next to the budget (in tokens)
            return max(1, scale + d.integer(-2, 2))
        return d.integer(1, 3 * scale)

    spec_kw = dict(
        context_lens=tuple(context() for _ in range(n)),
        row_budget=budget,
        max_context_chunk=mcc,
        split_alignment=align,
        dcp_world_size=world,
        interleave=inter,
        call_site=not direct,
    )
    return PlanSpec(**spec_kw)


def materialize(spec: PlanSpec, *, seed: int, device: str) -> Case:
    """The call's arguments: ``context_lens`` also as an int32 CPU tensor (what vLLM lists it from)."""
    params = {
        "context_lens": list(spec.context_lens),
        "row_budget": spec.row_budget,
        "max_context_chunk": spec.max_context_chunk,
        "split_alignment": spec.split_alignment,
        "dcp_world_size": spec.dcp_world_size,
        "interleave": spec.interleave,
    }
    tensors = {"context_lens": torch.tensor(spec.context_lens, dtype=torch.int32)}
    return Case(op="plan", spec=spec, seed=int(seed), device=str(torch.device(device)), tensors=tensors, params=params)


def features(spec: PlanSpec) -> set[str]:
    out = {"args:call-site" if spec.call_site else "args:direct", "dcp" if spec.dcp_world_size > 1 else "no-dcp"}
    if 0 in spec.context_lens:
        out.add("context-0")
    if spec.max_context_chunk < spec.row_budget:
        out.add("max-chunk<budget")
    rows = [spec.padded_rows(c) for c in spec.context_lens]
    if any(r > spec.row_budget for r in rows):
        out.add("split")
    if sum(rows) > spec.row_budget:
        out.add("chunks>1")
    return out


def size(spec: PlanSpec) -> dict[str, int]:
    return {"requests": len(spec.context_lens), "context": sum(spec.context_lens)}


def reduce(s: PlanSpec) -> Iterator[PlanSpec]:
    for lens in drop_each(s.context_lens):
        if lens:
            yield from attempt(lambda: dataclasses.replace(s, context_lens=lens))
    for j, c in enumerate(s.context_lens):
        for v in halvings(c):
            yield from attempt(
                lambda: dataclasses.replace(s, context_lens=s.context_lens[:j] + (v,) + s.context_lens[j + 1 :])
            )
    if s.dcp_world_size > 1:
        yield from attempt(
            lambda: dataclasses.replace(s, dcp_world_size=1, interleave=1, row_budget=s.row_budget * s.dcp_world_size)
        )


INVALID: tuple[InvalidClass, ...] = ()


GENERATOR = Generator(
    spec_type=PlanSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=size,
    reduce=reduce,
    invalid=INVALID,
)
