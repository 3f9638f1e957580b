"""Packing and unpacking the 352-byte nvfp4_ds_mla record (oracles/formats/nvfp4_record.py)."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.oracles.formats.nvfp4_record import RECORD_BYTES, pack, pack_loop, unpack, unpack_loop


def random_records(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, RECORD_BYTES), dtype=torch.uint8, generator=gen)


def test_unpack_then_pack_gives_back_every_byte_in_both_versions() -> None:
    rec = random_records(6, 0).reshape(2, 3, RECORD_BYTES)
    for unpack_fn in (unpack, unpack_loop):
        p = unpack_fn(rec)
        assert p.codes.shape == (2, 3, 512) and p.scales.shape == (2, 3, 32) and p.rope.shape == (2, 3, 64)
        assert int(p.codes.max()) <= 15
        for pack_fn in (pack, pack_loop):
            assert torch.equal(pack_fn(codes=p.codes, scales=p.scales, rope=p.rope), rec)
    a, b = unpack(rec), unpack_loop(rec)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales) and torch.equal(a.rope, b.rope)


def test_even_element_is_the_low_nibble_and_scales_sit_at_the_permuted_bytes() -> None:
    codes = torch.zeros(1, 512, dtype=torch.uint8)
    codes[0, 0], codes[0, 1], codes[0, 510], codes[0, 511] = 0x3, 0xA, 0x9, 0x7
    scales = torch.arange(32, dtype=torch.uint8).reshape(1, 32) + 0x40  # block s's scale is 0x40 + s
    rope = torch.arange(64, dtype=torch.uint8).reshape(1, 64)
    rec = pack(codes=codes, scales=scales, rope=rope)[0].tolist()
    assert rec[0] == 0xA3 and rec[255] == 0x79 and rec[1:255] == [0] * 254
    assert rec[256:320] == list(range(64))
    for s in range(32):
        assert rec[320 + 8 * (s & 3) + (s >> 2)] == 0x40 + s
    assert rec[320:328] == [0x40, 0x44, 0x48, 0x4C, 0x50, 0x54, 0x58, 0x5C]  # byte 8q + c <- block 4c + q


def test_a_code_above_15_or_a_wrong_plane_shape_is_refused() -> None:
    zeros = dict(scales=torch.zeros(1, 32, dtype=torch.uint8), rope=torch.zeros(1, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="0..15, got 16"):
        pack(codes=torch.full((1, 512), 16, dtype=torch.uint8), **zeros)
    with pytest.raises(ValueError, match="rope: .*expected uint8 \\[1, 64\\]"):
        pack(
            codes=torch.zeros(1, 512, dtype=torch.uint8),
            scales=zeros["scales"],
            rope=torch.zeros(1, 63, dtype=torch.uint8),
        )
    with pytest.raises(ValueError, match="last dim must be 352"):
        unpack(torch.zeros(2, 656, dtype=torch.uint8))
