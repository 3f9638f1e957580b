"""A case's random words: views and windows of one fixed table of hashed words.

Generation is host-bound on a GPU (each torch op costs ~5-10 us of Python
whatever its size) and memory-bound for big tensors, so a case does not hash
its own words. Instead every process builds, once per device, the table

    POOL[j] = Stream(0, "mlafuzz/word-pool").words(...)[j] & 0x7FFF_FFFF,   j < 2**20,

stored twice over (int32 [2 * POOL_WORDS]) so that any window of up to
POOL_WORDS words that starts in the first copy is a contiguous slice. Then:

- ``Draws(seed, name).words(n)``: POOL[(o + i) mod 2**20] for i < n, where
  the offset o = Stream(seed, name).k0 mod 2**20 (blake2b on the host): a
  slice, no device op at all;
- ``windows(offsets, width)``: row r is POOL[(offsets[r] + c) mod 2**20], c <
  width, for per-row offsets taken from such words: one ``index_select`` of
  an unfolded view (read the table, write the rows);
- ``Draws.host_int(bound)``: a host-side int from the same key (slack sizes,
  choices that decide an allocation): no device sync ever.

So element c of row r of a tensor is a counter-based hash of (seed, tensor,
r, c): the hash of (its row's hashed offset + c) under the fixed key. Words
are 31-bit (int32, non-negative), so ``w % n`` and ``w & mask`` are exact in
int32 on every device, with a relative bias below n / 2**31.

What this gives up, knowingly: streams of one process share one table, so two
streams whose offsets land within n words of each other share a run of words
(shifted). Positions or bytes correlated that way are harmless to a fuzzer
(each tensor then maps the words through its own bounds and tables); a period
of 2**20 words per stream is enforced (``words`` refuses longer runs; bulk
tensors use per-row windows).

Exactness: the table is built on the CPU by the exact int64 hash
(hashing.py) and copied to the device, so it is byte-identical everywhere;
everything after it is integer indexing, ``%``, ``&`` and compares on
non-negative int32 values, which no device can round or wrap.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.shuffle import PermKey, perm_key

__all__ = ["POOL_WORDS", "WORD_MASK", "QUARTER", "Draws", "device_name", "word_pool", "windows", "window_width"]

POOL_WORDS = 1 << 20
WORD_MASK = POOL_WORDS - 1  # a word & this: an offset into the table
QUARTER = 1 << 29  # a 31-bit word is below this with probability 1/4
_WORD_BITS = 0x7FFF_FFFF

Device = torch.device | str


def device_name(device: Device) -> str:
    """The device as the builders' per-device caches key it ("cuda" and "cuda:0" stay apart as
    torch spells them)."""
    return str(torch.device(device))


@functools.lru_cache(maxsize=8)
def _table(device: str) -> Tensor:
    words = Stream(0, "mlafuzz/word-pool").words(POOL_WORDS, device="cpu") & _WORD_BITS
    table = words.to(torch.int32)
    return torch.cat([table, table]).to(device)


def word_pool(device: Device) -> Tensor:
    """The doubled table, int32 [2 * POOL_WORDS], on ``device`` (built once per process and device;
    never written: every use reads it)."""
    return _table(device_name(device))


def windows(offsets: Tensor, width: int, *, device: Device) -> Tensor:
    """int32 [len(offsets), width]: row r is the ``width`` table words from offsets[r] (int32 or int64,
    in [0, POOL_WORDS)), one index_select of the table's unfolded view."""
    table = word_pool(device)
    return torch.index_select(table.unfold(0, window_width(width), 1), 0, offsets.reshape(-1))


def window_width(width: int) -> int:
    """``width``, checked: a window holds 1..POOL_WORDS words (the fused kernels read windows of
    the table themselves, and ask first)."""
    if not 0 < width <= POOL_WORDS:
        raise ValueError(f"width={width}: a window holds 1..{POOL_WORDS} words")
    return width


@dataclass(frozen=True)
class Draws:
    """The words of one named stream of a case: a slice of the table at its hashed offset."""

    seed: int
    name: str

    # Hashed on first use: a case names more streams than it reads (a parent only names its
    # children), and a hash costs a few microseconds of a realistic case's host time.
    @functools.cached_property
    def offset(self) -> int:
        return self._stream.k0 & WORD_MASK

    @functools.cached_property
    def key(self) -> int:
        return self._stream.k1

    @functools.cached_property
    def _stream(self) -> Stream:
        return Stream(self.seed, self.name)

    def child(self, name: str) -> Draws:
        return Draws(self.seed, f"{self.name}/{name}")

    def words(self, n: int, *, device: Device) -> Tensor:
        """int32 [n] of 31-bit words (a view of the table: callers must not write it)."""
        return word_pool(device)[self.offset : self.offset + self.span(n)]

    def span(self, n: int) -> int:
        """``n``, checked: a stream holds at most POOL_WORDS words (the fused kernels read the
        table at ``offset`` .. ``offset + n`` themselves, and ask first)."""
        if not 0 <= n <= POOL_WORDS:
            raise ValueError(f"n={n}: a stream holds at most {POOL_WORDS} words; use windows for more")
        return n

    def grid(self, rows: int, cols: int, *, device: Device) -> Tensor:
        """int32 [rows, cols]: ``words(rows * cols)`` viewed as rows."""
        return self.words(rows * cols, device=device).view(rows, cols)

    def perm(self, n: int) -> PermKey:
        """This stream's keyed permutation of [0, n) (shuffle.py): a random order with no sort."""
        return perm_key(self.seed, self.name, n)

    def host_int(self, bound: int, *, salt: int = 0) -> int:
        """A host int in [0, bound) from this stream's key (no device work): for choices that decide
        a shape or an allocation. ``salt`` gives independent picks of one stream."""
        if bound < 1:
            raise ValueError(f"bound={bound}: must be >= 1")
        return Stream(self.key + salt, self.name).k0 % bound
