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

import dataclasses
import hashlib
import random
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, TypeVar

from hypothesis import strategies as st

from mlafuzz.generators.spec import Layout, Paging, View
from mlafuzz.oracles.formats import table as formats

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
    # The convert's K also at multiples of BLOCK_N that are not a power of two (vLLM 0.31.0 runs such
    # a counted row as one padded tile when next_pow2(K) <= 4096: GLM's K = 2176 = 17 * 128).
    odd_topk_multiples: tuple[int, ...] = (3,)
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
    # Compile-aware draws (``Deployment``): a fuzz run draws the options a kernel may compile per
    # value from this many deployments, a pool fixed by the run seed (0: every case draws its own).
    deployments: int = 8
    run_seed: int | None = None  # the pool's seed, set by the fuzz loop (``for_run``); None: no pool
    # The nvfp4 writer's judging (SPEC 11.3), chosen by the user (fuzz --nvfp4-writer, --ties):
    # the writer revision its cases name (oracles.formats.writer_rules) and whether an exact e2m1
    # tie's other neighbour is accepted (``either``) or a mismatch (``exact``).
    nvfp4_writer: str = "rn_bump.mul_recip"
    nvfp4_ties: str = "exact"

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
        if self.deployments < 0:
            raise ValueError(f"Knobs: deployments={self.deployments!r} must be >= 0")

    def for_run(self, seed: int) -> Knobs:
        """These knobs for the cases of a run seeded ``seed``: their compile-relevant options come
        from that run's pool of deployments (``Deployment``)."""
        return dataclasses.replace(self, run_seed=int(seed)) if self.deployments else self


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
    odd_topk_multiples=(17, 3),
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


def draw_paging(
    d: Drawer,
    knobs: Knobs,
    *,
    high: bool = True,
    block_size: int | None = None,
    record_bytes: int = formats.get("fp8_ds_mla").record_bytes,
) -> Paging:
    """Block size (unless given: a deployment's), layout, spares, extra columns; with ``high``, 1
    case in base_one_in at the top of a larger cache (base_block: the cache's first byte offset near
    one of base_offsets, records of ``record_bytes``: the op's cache format's)."""
    bs = d.choice(knobs.block_sizes) if block_size is None else block_size
    layout = d.choice(list(Layout))
    spare = d.integer(0, knobs.max_spare_blocks)
    extra = d.integer(0, knobs.max_extra_cols)
    base = 0
    if high and knobs.base_offsets and one_in(d, knobs.base_one_in):
        base = d.choice(knobs.base_offsets) // (bs * record_bytes) + d.integer(
            0, 1
        )  # the first block just below or above
    return Paging(block_size=bs, layout=layout, spare_blocks=spare, extra_table_cols=extra, base_block=base)


class Deployment:
    """The compile-relevant choices of one case, drawn from its run's pool of deployments.

    A user's Triton kernel written as vLLM writes its convert makes every option a tl.constexpr
    (block size, BLOCK_N, K, the prefill flag, the stride option, even the block table's width),
    and Triton specializes int arguments on divisibility by 16 and on the value 1: every new
    combination is a compile of about a second. Production fixes most of them per deployment
    (vLLM's block table has one width for a whole run), so a fuzz run does too: its cases take
    those options from ``knobs.deployments`` deployments, fixed by the run seed, so a worker
    compiles each variant once, not once per case. Each option's values are dealt to the pool in
    an order the run seed shuffles (every value of a list no longer than the pool appears in every
    run; the combinations change from run to run), so coverage is kept on purpose, not by luck.

    Without a pool (``knobs.run_seed`` None: tests, Hypothesis, ``draw_with_seed``) every call is
    the case drawer's own, in the same order: the draws are exactly those of before."""

    def __init__(self, d: Drawer, knobs: Knobs, *, op: str) -> None:
        self._d = d
        size = knobs.deployments if knobs.run_seed is not None else 0
        self._size = size
        self._key = f"mlafuzz-deployments:{knobs.run_seed}:{op}"
        self.index: int | None = d.choice(range(size)) if size else None  # this case's deployment

    @property
    def pooled(self) -> bool:
        return self.index is not None

    def _random(self, *parts: object) -> random.Random:
        digest = hashlib.sha256(":".join(map(str, (self._key, *parts))).encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "little"))

    def choice(self, name: str, options: Sequence[T]) -> T:
        """The deployment's value of option ``name``: the options dealt round the pool (each as often
        as the pool allows), in an order of its own per option and run."""
        if self.index is None:
            return self._d.choice(options)
        rng = self._random(name)
        values = list(options)
        rng.shuffle(values)  # which values a pool smaller than the list holds
        dealt = [values[k % len(values)] for k in range(self._size)]
        rng.shuffle(dealt)  # which deployment gets which: each option on its own, not in step
        return dealt[self.index]

    def boolean(self, name: str) -> bool:
        return self._d.boolean() if self.index is None else self.choice(name, (False, True))

    def integer(self, name: str, lo: int, hi: int) -> int:
        """The deployment's int in [lo, hi] (edge-biased, as RandomDrawer's)."""
        if self.index is None:
            return self._d.integer(lo, hi)
        return RandomDrawer(self._random(name, self.index, lo, hi).getrandbits(63)).integer(lo, hi)

    def view(self, name: str, knobs: Knobs, kinds: tuple[View, ...]) -> View:
        """``draw_view``'s choice, fixed per deployment (a call site passes one layout)."""
        if self.index is None:
            return draw_view(self._d, knobs, kinds)
        plain = (View.PLAIN,) * (len(kinds) * (knobs.views_one_in - 1)) if knobs.views_one_in > 0 else (View.PLAIN,)
        return self.choice(name, plain + (kinds if knobs.views_one_in > 0 else ()))


# The table widths a pool deals out on purpose: Triton specializes an int argument (a width, a
# row stride) on the value 1 and on divisibility by 16.
WIDTH_KINDS = ("one", "multiple_of_16", "other")
MAX_WIDTH = 1 << 16  # Paging's bound on unused columns (a width that wide is already all of them)


def table_width(dep: Deployment, knobs: Knobs, *, block_size: int) -> int:
    """A deployment's block-table width (vLLM's max_num_blocks_per_req: max_model_len over the block
    size, one per run): 1, a multiple of 16 or neither, within what the knobs' sizes can use."""
    cap = max(2, min(knobs.max_table, -(-knobs.max_seq_len // block_size) + knobs.max_extra_cols, MAX_WIDTH))
    kind = dep.choice("table_width", WIDTH_KINDS)
    if kind == "one":
        return 1
    if kind == "multiple_of_16":
        return 16 * dep.integer("width16", 1, max(1, cap // 16))
    width = dep.integer("width", 2, cap)
    return width + 1 if width % 16 == 0 else width


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
