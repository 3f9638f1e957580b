"""Tests for mlafuzz.generators.rng.hashing: counter-based streams, exact on every device."""

from __future__ import annotations

import random

import pytest
import torch

from mlafuzz.generators.rng.hashing import M32, Stream, as_int32, mix, mix_reference, scale_below

CPU = "cpu"


def test_same_seed_and_name_give_the_same_words() -> None:
    assert torch.equal(Stream(7, "a").words((3, 5), device=CPU), Stream(7, "a").words((3, 5), device=CPU))
    assert Stream(7, "a") == Stream(7, "a") and hash(Stream(7, "a")) == hash(Stream(7, "a"))


@pytest.mark.parametrize("other", [Stream(7, "b"), Stream(8, "a"), Stream(7, "a/b"), Stream(7, "a ")])
def test_different_names_or_seeds_give_different_words(other: Stream) -> None:
    a = Stream(7, "a").words(64, device=CPU)
    b = other.words(64, device=CPU)
    assert (a != b).sum() >= 60  # a collision per word is 2**-32


def test_key_derivation_is_pinned() -> None:
    # The replay contract across machines and versions: these must never change silently.
    s = Stream(1, "x")
    assert (s.k0, s.k1) == (1118438851, 2083377526)
    assert s.words(4, device=CPU).tolist() == [2489820858, 2273302419, 2158177913, 2753338883]


def test_child_is_the_slash_joined_name() -> None:
    assert Stream(3, "case").child("topk") == Stream(3, "case/topk")
    assert torch.equal(
        Stream(3, "case").child("topk").words(8, device=CPU), Stream(3, "case/topk").words(8, device=CPU)
    )


@pytest.mark.parametrize("start", [0, 1, 1000, (1 << 31) - 5, (1 << 32) - 3, 1 << 40])
def test_words_at_start_is_a_slice_of_a_longer_call(start: int) -> None:
    s = Stream(0, "slice")
    base = max(start - 7, 0)
    long = s.words(32, device=CPU, start=base)
    off = start - base
    assert torch.equal(s.words(9, device=CPU, start=start), long[off : off + 9])


def test_fast_and_general_paths_agree_across_the_boundary() -> None:
    s = Stream(5, "paths")
    start = (1 << 31) - 8  # the call spans the fast-path limit: it takes the general path
    spanning = s.words(16, device=CPU, start=start)
    assert torch.equal(spanning[:8], s.words(8, device=CPU, start=start))  # fast path
    assert torch.equal(spanning, s.words_at(torch.arange(start, start + 16)))


def test_words_at_matches_words_for_any_index_order() -> None:
    s = Stream(2, "at")
    full = s.words(1000, device=CPU)
    idx = torch.tensor([999, 0, 5, 5, 500, 1, 998])
    assert torch.equal(s.words_at(idx), full[idx])
    assert torch.equal(s.words_at(idx.reshape(1, 7)), full[idx].reshape(1, 7))


_EDGE_INDICES = [0, 1, M32 - 1, M32, 1 << 32, (1 << 32) + 1, (1 << 40) + 12345, (1 << 62), (1 << 63) - 1]
_EDGE_KEYS = [(0, 0), (0, M32), ((1 << 31) - 1, 0), ((1 << 31) - 1, M32), (12345, 678910)]


@pytest.mark.parametrize("k0,k1", _EDGE_KEYS)
def test_mixer_matches_the_python_integer_reference(k0: int, k1: int) -> None:
    rng = random.Random(k0 ^ k1)
    indices = _EDGE_INDICES + [rng.getrandbits(32) for _ in range(300)] + [rng.getrandbits(63) for _ in range(300)]
    got = mix(torch.tensor(indices, dtype=torch.int64), k0=k0, k1=k1).tolist()
    assert got == [mix_reference(i, k0=k0, k1=k1) for i in indices]
    assert all(0 <= v <= M32 for v in got)


def test_stream_words_match_the_reference() -> None:
    s = Stream(11, "ref")
    assert s.words(50, device=CPU, start=77).tolist() == [mix_reference(i, k0=s.k0, k1=s.k1) for i in range(77, 127)]


def test_mixer_rejects_keys_out_of_range() -> None:
    with pytest.raises(ValueError):
        mix(torch.arange(3), k0=1 << 31, k1=0)


def test_words_bits_look_balanced() -> None:
    w = Stream(0, "bits").words(1 << 16, device=CPU)
    ones = ((w.unsqueeze(1) >> torch.arange(32)) & 1).float().mean(0)
    assert ((ones - 0.5).abs() < 0.01).all()
    flips = ((w[1:] ^ w[:-1]).unsqueeze(1) >> torch.arange(32)) & 1  # neighbouring indices
    assert ((flips.float().mean(0) - 0.5).abs() < 0.01).all()


@pytest.mark.parametrize("bound", [1, 2, 3, 10, 1000, (1 << 31) - 1, 1 << 31])
def test_below_is_in_range(bound: int) -> None:
    v = Stream(1, "below").below(bound, 4096, device=CPU)
    assert v.dtype == torch.int64 and int(v.min()) >= 0 and int(v.max()) < bound


def test_below_is_roughly_uniform() -> None:
    v = Stream(1, "uniform").below(10, 100_000, device=CPU)
    counts = torch.bincount(v, minlength=10).float()
    assert ((counts / 10_000 - 1).abs() < 0.05).all()


def test_below_takes_a_broadcast_tensor_bound() -> None:
    bound = torch.tensor([[1], [7], [1 << 20]])
    v = Stream(1, "tb").below(bound, (3, 500), device=CPU)
    assert (v >= 0).all() and (v < bound).all() and (v[0] == 0).all()
    assert int(v[2].max()) > 1 << 18  # the large bound is really used


def test_below_rejects_bounds_past_2_31() -> None:
    with pytest.raises(ValueError):
        Stream(1, "big").below((1 << 31) + 1, 4, device=CPU)
    with pytest.raises(ValueError):
        scale_below(torch.zeros(1, dtype=torch.int64), -1)


def test_integers_int_and_tensor_bounds() -> None:
    s = Stream(4, "int")
    v = s.integers(-5, 5, 2000, device=CPU)
    assert int(v.min()) == -5 and int(v.max()) == 4
    lo = torch.tensor([0, 100, -(1 << 30)])
    hi = torch.tensor([1, 200, 1 << 30])
    t = s.integers(lo.unsqueeze(1), hi.unsqueeze(1), (3, 100), device=CPU)
    assert (t >= lo.unsqueeze(1)).all() and (t < hi.unsqueeze(1)).all()


@pytest.mark.parametrize("num,den", [(0, 1), (1, 4), (1, 2), (3, 4), (1, 1), (5, 3)])
def test_coin_probability(num: int, den: int) -> None:
    c = Stream(9, f"coin{num}/{den}").coin(num, den, 40_000, device=CPU)
    assert c.dtype == torch.bool
    assert abs(c.float().mean().item() - min(num / den, 1.0)) < 0.01


def test_choice_picks_every_value_and_keeps_dtype() -> None:
    values = torch.tensor([0.5, -2.0, float("inf")], dtype=torch.float32)
    c = Stream(1, "choice").choice(values, (50, 4), device=CPU)
    assert c.shape == (50, 4) and c.dtype == torch.float32
    assert set(c.reshape(-1).tolist()) == set(values.tolist())


@pytest.mark.parametrize("n", [0, 1, 2, 17, 4096])
def test_permutation_is_a_permutation(n: int) -> None:
    p = Stream(1, "perm").permutation(n, device=CPU)
    assert torch.equal(torch.sort(p).values, torch.arange(n))
    if n > 16:
        assert not torch.equal(p, torch.arange(n))


def test_batched_permutations_differ_per_row() -> None:
    p = Stream(1, "perms").permutation(256, batch=(4, 2), device=CPU)
    assert p.shape == (4, 2, 256)
    assert (torch.sort(p, dim=-1).values == torch.arange(256)).all()
    assert len({tuple(r.tolist()) for r in p.reshape(8, 256)}) == 8


def test_bytes_are_the_words_little_endian() -> None:
    s = Stream(1, "bytes")
    b = s.bytes(10, device=CPU)
    w = s.words(3, device=CPU).tolist()
    expect = [(x >> (8 * i)) & 0xFF for x in w for i in range(4)][:10]
    assert b.dtype == torch.uint8 and b.tolist() == expect
    assert torch.bincount(s.bytes(1 << 16, device=CPU).long(), minlength=256).min() > 150


def test_as_int32_keeps_the_bits() -> None:
    w = torch.tensor([0, 1, (1 << 31) - 1, 1 << 31, M32], dtype=torch.int64)
    assert as_int32(w).tolist() == [0, 1, (1 << 31) - 1, -(1 << 31), -1]
    assert (as_int32(w).to(torch.int64) & M32).tolist() == w.tolist()


@pytest.mark.gpu
def test_every_stream_output_is_byte_identical_on_cuda() -> None:
    s = Stream(123, "gpu")
    outs = {}
    for dev in ("cpu", "cuda"):
        outs[dev] = [
            s.words((7, 300), device=dev),
            s.words(64, device=dev, start=(1 << 31) - 20),
            s.words(64, device=dev, start=(1 << 40)),
            s.words_at(torch.tensor(_EDGE_INDICES, device=dev)),
            s.below(1000, 5000, device=dev),
            s.below(torch.tensor([[3], [1 << 31]], device=dev), (2, 99), device=dev),
            s.integers(-7, 9, 999, device=dev),
            s.coin(1, 3, 999, device=dev),
            s.choice(torch.tensor([1.5, -0.0, float("nan")]), 99, device=dev),
            s.permutation(5000, device=dev),
            s.permutation(256, batch=(64,), device=dev),
            s.bytes(4097, device=dev),
        ]
    for a, b in zip(outs["cpu"], outs["cuda"]):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))
