"""Drawing specs: one description, two sources of choices.

Each op's spec drawer (generators/ops/<op>.py ``draw``) is written once against
the small ``Drawer`` protocol. The
fuzz loop drives them with ``RandomDrawer`` (a seeded ``random.Random``: cheap,
deterministic per case seed, shardable); tests and the shrinker drive them with
``HypothesisDrawer`` so Hypothesis can shrink every choice towards its minimum
(first option of a choice, low end of a range). Hypothesis draws small specs
and seeds, never big tensors.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, TypeVar

from hypothesis import strategies as st

from mlafuzz.generators.spec import Layout, Paging

T = TypeVar("T")


class Drawer(Protocol):
    def integer(self, lo: int, hi: int) -> int:
        """An int in [lo, hi] (inclusive); shrinks towards lo."""

    def choice(self, options: Sequence[T]) -> T:
        """One of options; shrinks towards options[0]."""

    def boolean(self) -> bool:
        """Shrinks towards False."""


class RandomDrawer:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        # Bias towards small values and the edges: boundaries are where kernels break.
        r = self._rng.random()
        if r < 0.15:
            return lo
        if r < 0.25:
            return hi
        if r < 0.6:
            return self._rng.randint(lo, min(hi, lo + max(1, (hi - lo) // 8)))
        return self._rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return options[self._rng.randrange(len(options))]

    def boolean(self) -> bool:
        return self._rng.random() < 0.5


class HypothesisDrawer:
    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def choice(self, options: Sequence[T]) -> T:
        return self._draw(st.sampled_from(list(options)))

    def boolean(self) -> bool:
        return self._draw(st.booleans())


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """Size bounds for drawn specs. Defaults are small enough for the Triton interpreter."""

    max_requests: int = 4
    max_seq_len: int = 300
    max_tokens_per_request: int = 3
    block_sizes: tuple[int, ...] = (64, 1, 3, 16)
    block_ns: tuple[int, ...] = (16, 32, 64)
    topk_multiples: tuple[int, ...] = (1, 2, 4)
    max_spare_blocks: int = 4
    max_extra_cols: int = 3

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_seq_len", "max_tokens_per_request"):
            if getattr(self, name) < 1:
                raise ValueError(f"Knobs: {name}={getattr(self, name)!r} must be >= 1")


SMALL = Knobs()
# Realistic sizes for a GPU run (DeepSeek V3.2: K = 2048, bs = 64, BLOCK_N = 128).
LARGE = Knobs(max_requests=64, max_seq_len=8192, max_tokens_per_request=8, block_sizes=(64, 1, 16, 128),
              block_ns=(128, 64), topk_multiples=(16, 1, 4), max_spare_blocks=64, max_extra_cols=8)
KNOB_PRESETS: dict[str, Knobs] = {"small": SMALL, "large": LARGE}


def draw_paging(d: Drawer, knobs: Knobs) -> Paging:
    return Paging(
        block_size=d.choice(knobs.block_sizes),
        layout=d.choice(list(Layout)),
        spare_blocks=d.integer(0, knobs.max_spare_blocks),
        extra_table_cols=d.integer(0, knobs.max_extra_cols),
    )


SpecDrawer = Callable[[Drawer, Knobs], Any]  # an op's ``draw`` (generators/ops/<op>.py)


def draw_with_seed(draw: SpecDrawer, *, seed: int, knobs: Knobs = SMALL) -> Any:
    """The spec of one fuzz case: a pure function of (the op's drawer, seed, knobs)."""
    return draw(RandomDrawer(seed), knobs)


def specs(draw: SpecDrawer, knobs: Knobs = SMALL) -> st.SearchStrategy[Any]:
    """Hypothesis strategy of the specs an op's drawer makes; shrinks towards small, simple batches."""

    @st.composite
    def _specs(hyp_draw: Callable[[st.SearchStrategy[Any]], Any]) -> Any:
        return draw(HypothesisDrawer(hyp_draw), knobs)

    return _specs()


def cases_strategy(draw: SpecDrawer, knobs: Knobs = SMALL) -> st.SearchStrategy[tuple[Any, int]]:
    """(spec, seed) pairs: what a property test needs to materialize a case."""
    return st.tuples(specs(draw, knobs), st.integers(0, 2**32 - 1))
