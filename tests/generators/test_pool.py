"""Tests for mlafuzz.generators.rng.pool: a case's words as views and windows of one fixed table."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.generators.rng.hashing import Stream
from mlafuzz.generators.rng.pool import POOL_WORDS, Draws, windows, word_pool

CPU = "cpu"


def test_the_table_is_the_masked_hash_stream_twice_over() -> None:
    table = word_pool(CPU)
    assert table.dtype == torch.int32 and table.shape == (2 * POOL_WORDS,)
    head = Stream(0, "mlafuzz/word-pool").words(64, device=CPU) & 0x7FFF_FFFF
    assert torch.equal(table[:64].long(), head) and torch.equal(table[:POOL_WORDS], table[POOL_WORDS:])
    assert int(table.min()) >= 0  # 31-bit words: % and & are exact in int32


def test_words_are_pinned_to_the_key() -> None:
    # The replay contract across machines and versions: these must never change silently.
    d = Draws(1, "x")
    assert d.offset == Stream(1, "x").k0 % POOL_WORDS
    assert d.words(4, device=CPU).tolist() == word_pool(CPU)[d.offset : d.offset + 4].tolist()
    assert d.words(3, device=CPU).tolist() == [674912832, 171536596, 740262111]


def test_same_seed_and_name_give_the_same_words_and_others_differ() -> None:
    a = Draws(7, "a").words(256, device=CPU)
    assert torch.equal(a, Draws(7, "a").words(256, device=CPU))
    for other in (Draws(7, "b"), Draws(8, "a"), Draws(7, "a").child("x")):
        assert (other.words(256, device=CPU) != a).sum() > 240
    assert Draws(7, "a").child("x") == Draws(7, "a/x")


def test_grid_is_the_words_as_rows() -> None:
    d = Draws(3, "grid")
    assert torch.equal(d.grid(5, 7, device=CPU).reshape(-1), d.words(35, device=CPU))


def test_windows_are_runs_of_the_table_from_each_offset() -> None:
    table = word_pool(CPU)
    offsets = torch.tensor([0, POOL_WORDS - 1, 12345, 12345])
    rows = windows(offsets, 300, device=CPU)
    assert rows.shape == (4, 300) and rows.dtype == torch.int32
    for r, o in enumerate(offsets.tolist()):
        assert torch.equal(rows[r], table[o : o + 300])
    assert torch.equal(windows(offsets.to(torch.int32), 300, device=CPU), rows)


def test_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        Draws(0, "n").words(POOL_WORDS + 1, device=CPU)
    with pytest.raises(ValueError):
        windows(torch.tensor([0]), 0, device=CPU)
    with pytest.raises(ValueError):
        Draws(0, "n").host_int(0)


def test_host_ints_are_deterministic_in_range_and_salted() -> None:
    d = Draws(5, "host")
    picks = [d.host_int(10, salt=s) for s in range(200)]
    assert picks == [Draws(5, "host").host_int(10, salt=s) for s in range(200)]
    assert set(picks) == set(range(10))
