"""Keyed permutations (generators/rng/shuffle.py): what a shuffled block table and the writer's slots
rest on. Each must be a bijection of [0, n) for every n, the same function on tensors and on Python
ints, a different order per stream, and about as random as a uniform permutation."""

from __future__ import annotations

import collections

import pytest
import torch

from mlafuzz.generators.rng.shuffle import _scattered, perm_key, permutation, permute, permute_reference


@pytest.mark.parametrize("n", [1, 2, 3, 5, 63, 64, 65, 1000, 4097, 65536 + 640, 1 << 20])
def test_a_keyed_permutation_is_a_bijection_of_its_range(n: int) -> None:
    values = permute(torch.arange(n), perm_key(n, "t", n))
    assert values.dtype == torch.int64
    assert torch.equal(torch.sort(values).values, torch.arange(n))


@pytest.mark.parametrize("n", [1, 7, 100, 513])
def test_the_tensor_permutation_is_the_python_reference(n: int) -> None:
    key = perm_key(3, "ref", n)
    assert permute(torch.arange(n), key).tolist() == [permute_reference(i, key) for i in range(n)]


def test_any_subset_of_indices_gets_the_values_of_the_whole() -> None:
    key = perm_key(1, "sub", 9000)
    whole = permute(torch.arange(9000), key)
    picks = torch.tensor([8999, 0, 4500, 17, 17])
    assert torch.equal(permute(picks, key), whole[picks])
    grid = torch.tensor([[5, 9], [8000, 1]])  # any shape, each value where the whole put it
    assert torch.equal(permute(grid, key), whole[grid])


def test_streams_and_seeds_give_different_orders() -> None:
    n = 4096
    orders = {tuple(permute(torch.arange(n), perm_key(s, name, n)).tolist()) for s in (0, 1) for name in ("a", "b")}
    assert len(orders) == 4


@pytest.mark.parametrize("n", [3, 4, 5])
def test_small_permutations_are_close_to_uniform(n: int) -> None:
    # Every one of the n! orders turns up and none is twice as likely as chance: a shuffled pool of
    # a few blocks is not left in order (the identity) much more often than a fair shuffle leaves it.
    import math

    draws = 400 * math.factorial(n)
    seen = collections.Counter(tuple(permute_reference(i, perm_key(s, "u", n)) for i in range(n)) for s in range(draws))
    assert len(seen) == math.factorial(n)
    assert max(seen.values()) < 2 * draws / math.factorial(n)


def test_a_permutation_beyond_int31_is_refused() -> None:
    for bad in (0, 1 << 31):
        with pytest.raises(ValueError, match="1..2"):
            perm_key(0, "x", bad)


@pytest.mark.parametrize("n", [1, 2, 3, 64, 65, 1000, 65536 + 640])
def test_a_whole_order_is_a_bijection_and_the_same_in_numpy_and_in_sync_free_torch(n: int) -> None:
    # The sync-free torch form (what a GPU runs) and the CPU's numpy form give one order: a case
    # made on a laptop holds the host tier a GPU case held.
    key = perm_key(5, "whole", n)
    order = permutation(key, device="cpu")
    assert torch.equal(torch.sort(order).values, torch.arange(n))
    assert torch.equal(_scattered(key, torch.device("cpu")), order)
    if n >= 64:  # not left in order
        assert not torch.equal(order, torch.arange(n))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 65, 1000, 65536 + 640, (1 << 22) + 3])
def test_a_whole_order_made_on_the_gpu_is_the_cpus(n: int) -> None:
    key = perm_key(9, "gpu", n)
    assert torch.equal(permutation(key, device="cuda").cpu(), permutation(key, device="cpu"))
