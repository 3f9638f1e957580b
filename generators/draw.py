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

from mlafuzz.generators.spec import Layout, Paging, View

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
    """Size bounds and mixes of drawn specs. Defaults are small enough for the Triton interpreter."""

    max_requests: int = 4
    max_seq_len: int = 300  # a request's context (tokens)
    max_tokens_per_request: int = 3  # a decode request's query rows
    max_prefill_tokens: int = 8  # a prefill request's query rows (convert's workspace rows)
    block_sizes: tuple[int, ...] = (64, 1, 3, 16)
    block_ns: tuple[int, ...] = (16, 32, 64)
    topk_multiples: tuple[int, ...] = (1, 2, 4)
    max_spare_blocks: int = 4
    max_extra_cols: int = 3
    # Bounds that keep a worker's memory bounded, whatever the draws: a case's rows (convert's
    # token rows, gather's dst rows, the writer's tokens), its block table's entries, and the
    # records its cache generates (cache bytes = records x 656, plus a zero head: base_offsets).
    max_rows: int = 64
    max_table: int = 4096
    max_records: int = 4096
    log_sizes: bool = False  # sizes log-uniform (many small, some huge), not the drawer's edge bias
    row_tiles: tuple[int, ...] = ()  # row counts also drawn at m * tile + {-1, 0, 1} (kernels' tiles)
    # 1 in base_one_in cases puts its blocks at the top of a larger cache: ids from
    # offset // (bs * 656), so record byte offsets start near one of base_offsets (SPEC 8).
    base_one_in: int = 8
    base_offsets: tuple[int, ...] = (1 << 16, 1 << 20)
    views_one_in: int = 3  # each call-site view (SPEC 8) is drawn 1 time in N (0: never)

    def __post_init__(self) -> None:
        for name in (
            "max_requests",
            "max_seq_len",
            "max_tokens_per_request",
            "max_prefill_tokens",
            "max_rows",
            "max_table",
            "max_records",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"Knobs: {name}={getattr(self, name)!r} must be >= 1")


SMALL = Knobs()
# Realistic sizes for a GPU run (DeepSeek V3.2: K = 2048, bs = 64, BLOCK_N = 128), sized so a case
# stays within the worker memory bound (README: at most about 10 GB, a 4.3 GB cache with its one
# working copy): rows <= 16384, a table <= 2**19 entries (2 MB), <= 2**19 generated records (344 MB),
# 1 case in 20 on a 2.1 or 4.3 GB cache.
LARGE = Knobs(
    max_requests=256,
    max_seq_len=131072,
    max_tokens_per_request=4,
    max_prefill_tokens=2048,
    block_sizes=(64, 64, 64, 1, 16, 128),
    block_ns=(128,),
    topk_multiples=(16, 16, 16, 16, 1, 4, 8, 32),
    max_spare_blocks=64,
    max_extra_cols=8,
    max_rows=16384,
    max_table=1 << 19,
    max_records=1 << 19,
    log_sizes=True,
    row_tiles=(2, 8, 128, 256, 1024),
    base_one_in=20,
    base_offsets=(1 << 31, 1 << 32),
    views_one_in=3,
)
KNOB_PRESETS: dict[str, Knobs] = {"small": SMALL, "large": LARGE}


def log_int(d: Drawer, lo: int, hi: int) -> int:
    """An int in [lo, hi], log-uniform: a power-of-two bucket of hi - lo, then uniform in it (many
    small values, some at the top); shrinks towards lo."""
    if hi <= lo:
        return lo
    e = d.integer(0, (hi - lo).bit_length())
    a = (1 << e) >> 1
    return lo + min(hi - lo, d.integer(a, max(a, (1 << e) - 1)))


def sized(d: Drawer, knobs: Knobs, lo: int, hi: int, *, tiles: tuple[int, ...] = ()) -> int:
    """A size in [lo, hi]: with log_sizes, log-uniform, and a quarter of the time at a kernel's
    tiling boundary (m * tile - 1, m * tile or m * tile + 1) when ``tiles`` are given."""
    if hi <= lo:
        return lo
    if not knobs.log_sizes:
        return d.integer(lo, hi)
    tiles = tuple(t for t in tiles if t <= hi)
    if tiles and d.integer(0, 3) == 3:
        tile = d.choice(tiles)
        return max(lo, min(hi, tile * d.integer(1, max(1, hi // tile)) + d.choice((0, -1, 1))))
    return log_int(d, lo, hi)


def tile_total(d: Drawer, knobs: Knobs, total: int, *, hi: int) -> int:
    """``total``, or (a quarter of the time, with row_tiles) the tiling boundary m * tile + {-1, 0, 1}
    nearest it, within [1, hi]: what a drawer moves a sum of sizes to (the last request absorbs it)."""
    tiles = tuple(t for t in knobs.row_tiles if t <= hi)
    if not tiles or not one_in(d, 4):
        return total
    tile = d.choice(tiles)
    return max(1, min(hi, max(1, round(total / tile)) * tile + d.choice((0, -1, 1))))


def one_in(d: Drawer, n: int) -> bool:
    """True 1 time in n exactly (a choice is uniform, unlike the edge-biased integer; never for n <=
    0); shrinks towards False."""
    return n > 0 and d.choice((False,) * (n - 1) + (True,))


def draw_view(d: Drawer, knobs: Knobs, kinds: tuple[View, ...]) -> View:
    """PLAIN, or 1 time in views_one_in one of ``kinds``; shrinks towards PLAIN."""
    return d.choice(kinds) if one_in(d, knobs.views_one_in) else View.PLAIN


def draw_paging(d: Drawer, knobs: Knobs, *, high: bool = True) -> Paging:
    """Block size, layout, spares, extra columns; with ``high``, 1 case in base_one_in at the top of
    a larger cache (base_block: the cache's first byte offset near one of base_offsets)."""
    bs = d.choice(knobs.block_sizes)
    layout = d.choice(list(Layout))
    spare = d.integer(0, knobs.max_spare_blocks)
    extra = d.integer(0, knobs.max_extra_cols)
    base = 0
    if high and knobs.base_offsets and one_in(d, knobs.base_one_in):
        base = d.choice(knobs.base_offsets) // (bs * 656) + d.integer(0, 1)  # the first block just below or above
    return Paging(block_size=bs, layout=layout, spare_blocks=spare, extra_table_cols=extra, base_block=base)


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
