"""Input fingerprints (harness.fingerprint): the fast path's "did the call change this input?"."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.harness.fingerprint import Snapshot, fingerprints  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@given(nbytes=st.sampled_from([8 * 1000, 4 * 1001, 1003]), where=st.integers(0, 2**31), bit=st.integers(0, 7),
       seed=st.integers(0, 2**31))
@settings(max_examples=12, deadline=None)
def test_flipping_any_bit_of_any_byte_moves_the_fingerprint(nbytes, where, bit, seed):
    """8-, 4- and 1-byte words (by size): a single changed word always moves the sum."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).to(DEV)
    other = t.clone()
    other[where % nbytes] ^= 1 << bit
    a, b = fingerprints([t, other]).tolist()
    assert a != b
    assert fingerprints([t.clone()]).tolist() == [a]  # and it depends on the bytes only


def test_swapping_two_words_moves_the_fingerprint():
    t = torch.arange(4096, dtype=torch.int64, device=DEV)
    swapped = t.clone()
    swapped[[10, 3000]] = swapped[[3000, 10]]
    assert fingerprints([t]).item() != fingerprints([swapped]).item()


def test_a_snapshot_names_the_changed_large_input_and_flags_the_small_ones_together(monkeypatch):
    import mlafuzz.harness.fingerprint as fp

    monkeypatch.setattr(fp, "SMALL_BYTES", 4096)
    big = torch.zeros(2048, dtype=torch.int32, device=DEV)
    small_a = torch.ones(3, device=DEV)
    small_b = torch.zeros((), dtype=torch.int64, device=DEV)
    inputs = {"big": big, "a": small_a, "b": small_b}
    snap = Snapshot(inputs)
    assert snap.large == ["big"] and snap.small == ["a", "b"]
    assert [bool(f) for _, f in snap.changed(inputs)] == [False, False]
    big[77] = 5
    small_b.fill_(1)
    assert [(names, bool(f)) for names, f in snap.changed(inputs)] == [("big", True), ("a, b", True)]
