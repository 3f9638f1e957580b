"""Keyed permutations computed element by element: a random order with no sort.

A block table's shuffled pool and the writer's distinct slots were stable
argsorts of random words. On a GPU a sort is the most expensive op a case made
(cub's radix passes, a dozen launches and ~200 us of host time, more than the
kernel under test), and it needs the whole array at once. Here value i of a
permutation of [0, n) is a pure function of (key, n, i), so a fused kernel
computes any entry where it needs it.

The construction is the textbook one for a keyed permutation of an arbitrary
range (format-preserving encryption): a Feistel network on b = bit_length(n - 1)
bits (at least 1), the value split into its high a = b - b // 2 bits H and low
c = b // 2 bits L, and ROUNDS rounds that alternate

    H ^= F(L ^ k_r) mod 2**a;    L ^= F(H ^ k_r) mod 2**c

where F is the stream mixer's rounds (hashing.py: lowbias32 on 32-bit words);
each round is a bijection whatever F is. Then "cycle walking": apply the
network again while the value is >= n; the cycle through i comes back to
[0, n), and the first value of it in range is a bijection of [0, n). As
2**b < 2n, a walk takes under two steps on average, rarely more than twenty.
Eight rounds, not four: with the few bits of a small range (a pool of 5..8
blocks), four left the identity order far likelier than chance
(tests/generators/test_shuffle.py holds the small cases near uniform).

The round keys k_r (31-bit, so a fused kernel's scalars stay int32) come from one
blake2b of the stream's name (``perm_key``). Exact on every device: here int64
values with products below 2**63 masked to 32 bits, in a fused kernel the same
words as uint32 (whose multiply wraps mod 2**32); no float, no reduction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from mlafuzz.generators.rng.hashing import C1, C2

__all__ = ["ROUNDS", "PermKey", "perm_key", "permutation", "permute", "permute_reference"]

ROUNDS = 8
MAX_N = (1 << 31) - 1  # a fused kernel's int32 scalar
_M32 = 0xFFFF_FFFF  # hashing.py's C1 and C2 keep products of 32-bit values below 2**63


@dataclass(frozen=True)
class PermKey:
    """A permutation of [0, n): its domain, the low half's width c (the high half: bits - c) and
    round keys."""

    n: int
    bits: int
    low: int
    keys: tuple[int, ...]

    def scalars(self) -> tuple[int, ...]:
        """What a fused kernel takes: n, c, the low and high halves' masks, then the round keys."""
        return (self.n, self.low, (1 << self.low) - 1, (1 << (self.bits - self.low)) - 1, *self.keys)


def perm_key(seed: int, name: str, n: int) -> PermKey:
    """The permutation of [0, n) named by (seed, name) (1 <= n < 2**31)."""
    if not 1 <= n <= MAX_N:
        raise ValueError(f"n={n}: a keyed permutation covers 1..2**31 - 1 values")
    bits = max(1, (n - 1).bit_length())
    digest = hashlib.blake2b(f"mlafuzz-perm-v1|{int(seed)}|{name}".encode(), digest_size=4 * ROUNDS).digest()
    keys = tuple(int.from_bytes(digest[4 * j : 4 * j + 4], "little") & 0x7FFF_FFFF for j in range(ROUNDS))
    return PermKey(n=n, bits=bits, low=bits // 2, keys=keys)


def _f(v: Any, k: int) -> Any:  # a torch tensor, a numpy array or a Python int: operators only
    y = v ^ k
    y = y ^ (y >> 16)
    y = (y * C1) & _M32
    y = y ^ (y >> 15)
    y = (y * C2) & _M32
    return y ^ (y >> 16)


def _network(x: Any, key: PermKey) -> Any:
    c = key.low
    lo_mask, hi_mask = (1 << c) - 1, (1 << (key.bits - c)) - 1
    hi, lo = x >> c, x & lo_mask
    for r, k in enumerate(key.keys):
        if r % 2 == 0:
            hi = hi ^ (_f(lo, k) & hi_mask)
        else:
            lo = lo ^ (_f(hi, k) & lo_mask)
    return (hi << c) | lo


def permute(index: Tensor, key: PermKey) -> Tensor:
    """int64: the permutation's values at ``index`` (integers in [0, n), any shape and device).

    The definition the fused kernels are held to. Each walking step takes the network again on
    the values still out of range only (half of them, then a quarter...), so a walk of 40 steps
    costs about two passes over the tensor, not 40; each step asks which are left (a host sync
    on a GPU, fine for the slow path). On the CPU the same operators run on numpy arrays: a
    hundred small ops a pass cost ~1 us each there against torch's ~1.5-2, which a CPU fuzz
    run's small cases feel."""
    flat = index.to(torch.int64).reshape(-1)
    if flat.device.type == "cpu":
        arange = lambda n: np.arange(n, dtype=np.int64)  # noqa: E731
        return torch.from_numpy(_walk(flat.numpy(), key, np.flatnonzero, arange)).reshape(index.shape)
    arange = lambda n: torch.arange(n, dtype=torch.int64, device=flat.device)  # noqa: E731
    return _walk(flat, key, lambda t: torch.nonzero(t).reshape(-1), arange).reshape(index.shape)


def _walk(x: Any, key: PermKey, nonzero: Callable[[Any], Any], arange: Callable[[int], Any]) -> Any:
    """The network, then cycle walking, on a 1-D int64 torch tensor or numpy array. When the
    domain is not much larger than x, the network runs once over all of it and a walking step is
    a lookup in that table (the same values: table[i] is the network at i); otherwise each step
    runs the network on the values still out of range."""
    if (1 << key.bits) <= 4 * len(x) + 4096:
        table = _network(arange(1 << key.bits), key)
        step = lambda v: table[v]  # noqa: E731
    else:
        step = lambda v: _network(v, key)  # noqa: E731
    y = step(x)
    left = nonzero(y >= key.n)
    while len(left):
        walked = step(y[left])
        y[left] = walked
        left = left[walked >= key.n]
    return y


def permutation(key: PermKey, *, device: str | torch.device) -> Tensor:
    """int64 [n]: a whole random order of [0, n), made with no host sync: the network's values
    over [0, 2**bits) that fall below n, in their order there (a bijection, as the network is one).
    Another order than ``permute``'s (which walks each value back into range, a host sync per
    walking step on a GPU: twenty-odd for a host tier's millions of rows); for a caller that needs
    every value and never one entry alone."""
    device = torch.device(device)
    if device.type == "cpu":
        table = _network(np.arange(1 << key.bits, dtype=np.int64), key)
        return torch.from_numpy(np.ascontiguousarray(table[table < key.n]))
    return _scattered(key, device)


def _scattered(key: PermKey, device: torch.device) -> Tensor:
    """``permutation`` in torch ops with no host sync (any device; the CPU takes numpy)."""
    table = _network(torch.arange(1 << key.bits, dtype=torch.int64, device=device), key)
    keep = table < key.n
    # The kept values' places by a running count; the others go to one spare slot, dropped
    # (a bool-mask index would read the count back on the host).
    at = torch.where(keep, torch.cumsum(keep, 0) - 1, key.n)
    out = torch.empty(key.n + 1, dtype=torch.int64, device=device)
    return out.scatter_(0, at, table)[: key.n]


def permute_reference(i: int, key: PermKey) -> int:
    """The same function on one Python int, walking one step at a time (arbitrary precision: an
    int64 overflow in the vector walks would show): what the tests hold ``permute`` to."""
    y = _network(i, key)
    while y >= key.n:
        y = _network(y, key)
    return y
