"""The nvfp4_ds_mla readers (oracles/formats/nvfp4_read.py, SPEC 11.2): the exact bf16 reader and
the FP8 staging reader, on every (e2m1 code, scale byte) pair and every RoPE byte."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from mlafuzz.oracles.formats.minifloat import e2m1_value, e4m3_value
from mlafuzz.oracles.formats.nvfp4_read import dequant, dequant_loop, loose_mask, stage_fp8, stage_fp8_loop
from mlafuzz.oracles.formats.nvfp4_record import pack


def records_of_scales(scale_bytes: list[int], rope: list[int] | None = None) -> torch.Tensor:
    """Records whose blocks take the given scale bytes in turn (32 per record), every block holding
    the codes 0..15 once each; RoPE bytes ``rope`` (64 per record, cycled) or zero."""
    n = -(-len(scale_bytes) // 32)
    sf = (scale_bytes * 32)[: 32 * n]
    codes = torch.arange(16, dtype=torch.uint8).repeat(n, 32)
    rp = ((rope or [0]) * 64 * n)[: 64 * n]
    return pack(
        codes=codes,
        scales=torch.tensor(sf, dtype=torch.uint8).reshape(n, 32),
        rope=torch.tensor(rp, dtype=torch.uint8).reshape(n, 64),
    )


def bits(t: torch.Tensor) -> list[int]:
    return (t.view(torch.int16).to(torch.int32) & 0xFFFF).reshape(-1).tolist()


VALID_SCALES = list(range(0x01, 0x7F))


def test_exact_reader_gives_the_exact_product_for_every_code_and_written_scale_byte() -> None:
    rec = records_of_scales(VALID_SCALES)
    got = dequant(rec)
    assert bits(got) == bits(dequant_loop(rec))
    nope = got[..., :512].float().reshape(-1, 32, 16)
    sf = (VALID_SCALES * 32)[: nope.shape[0] * 32]
    for r in range(nope.shape[0]):
        for blk in range(32):
            for c in range(16):
                exact = Fraction(e2m1_value(c)) * Fraction(e4m3_value(sf[32 * r + blk]))
                # the product is exact in bf16 (at most 6 significant bits, inside [2^-10, 2688])
                assert Fraction(nope[r, blk, c].item()) == exact
                if c == 8:
                    assert math.copysign(1, nope[r, blk, c].item()) < 0  # -0 stays -0
    assert not loose_mask(rec).any()


def test_rope_is_bf16_of_the_e4m3_value_in_the_exact_reader() -> None:
    rec = records_of_scales([0x38], rope=list(range(256))[:64]).repeat(4, 1)
    rec[:, 256:320] = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(4, 64)
    got = dequant(rec)[..., 512:].reshape(-1)
    assert bits(got) == bits(dequant_loop(rec)[..., 512:])
    for b, v in enumerate(got.float().tolist()):
        ref = e4m3_value(b)
        assert (math.isnan(v) and math.isnan(ref)) or (v == ref and math.copysign(1, v) == math.copysign(1, ref))


LOOSE_SCALES = [0x00, 0x7F, 0xFF] + list(range(0x80, 0xFF))


def test_unwritten_scale_bytes_keep_nan_ness_and_sign_and_are_marked_loose() -> None:
    rec = records_of_scales(LOOSE_SCALES)
    got = dequant(rec)
    assert bits(got) == bits(dequant_loop(rec))
    loose = loose_mask(rec)
    assert loose[..., :512].all() and not loose[..., 512:].any()
    nope = got[..., :512].float().reshape(-1, 32, 16)
    sf = (LOOSE_SCALES * 32)[: nope.shape[0] * 32]
    for r in range(nope.shape[0]):
        for blk in range(32):
            s = sf[32 * r + blk]
            for c in range(16):
                v = nope[r, blk, c].item()
                assert math.isnan(v) == (s in (0x7F, 0xFF))
                if not math.isnan(v):
                    assert (math.copysign(1, v) < 0) == (bool(c & 8) != bool(s & 0x80))


def staged_by_torch(rec: torch.Tensor, inv_scale: float) -> torch.Tensor:
    """Independent of the module: torch's own decode, f32 tensor arithmetic and float8 cast."""
    codes = torch.stack([rec[:, :256] & 0xF, rec[:, :256] >> 4], dim=-1).reshape(-1, 512)
    mags = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    val = torch.where(codes >= 8, -mags[(codes & 7).long()], mags[(codes & 7).long()])
    slot = torch.tensor([8 * (s & 3) + (s >> 2) for s in range(32)])
    sf = rec[:, 320:][:, slot].view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1)
    inv = torch.tensor(inv_scale, dtype=torch.float32)
    nope = (val * sf * inv).clamp(-448, 448)
    rope = (rec[:, 256:320].view(torch.float8_e4m3fn).float() * inv).clamp(-448, 448)
    if inv_scale == 1.0:
        return torch.cat([nope.to(torch.float8_e4m3fn).view(torch.uint8), rec[:, 256:320]], dim=1)
    return torch.cat([nope, rope], dim=1).to(torch.float8_e4m3fn).view(torch.uint8)


@pytest.mark.parametrize("inv_scale", [1.0, 0.5, 1 / 3, 3.7, 0.01])
def test_staging_reader_rounds_once_to_e4m3_and_clips_at_448_for_every_code_and_scale(inv_scale: float) -> None:
    rope = [b for b in range(256) if b not in (0x7F, 0xFF)]
    rec = records_of_scales(VALID_SCALES, rope=rope)
    got = stage_fp8(rec, inv_scale=inv_scale)
    assert torch.equal(got, stage_fp8_loop(rec, inv_scale=inv_scale))
    assert torch.equal(got, staged_by_torch(rec, inv_scale))


def test_staging_saturates_a_large_scale_with_code_6_and_copies_rope_bytes_at_unit_scale() -> None:
    # scale 80 (0x6A) x 6 = 480 > 448: SPEC's "a scale above 74.67 with code 6.0 saturates"
    rec = records_of_scales([0x6A, 0x68], rope=list(range(64)))
    assert e4m3_value(0x6A) == 80 and e4m3_value(0x68) == 64
    got = stage_fp8(rec, inv_scale=1.0)
    assert got[0, 7].item() == 0x7E and got[0, 15].item() == 0xFE  # block 0: +6 and -6 x 80 -> +-448
    assert e4m3_value(got[0, 16 + 7].item()) == 384  # block 1: 6 x 64 = 384, in range
    assert got[0, 512:].tolist() == list(range(64))
    # a rope byte NaN (0x7F) is copied at unit scale, staged as NaN otherwise
    rec[0, 256] = 0xFF
    assert stage_fp8(rec, inv_scale=1.0)[0, 512].item() == 0xFF
    assert stage_fp8(rec, inv_scale=2.0)[0, 512].item() == 0x7F == stage_fp8_loop(rec, inv_scale=2.0)[0, 512].item()
    rec[0, 257] = 0x7E  # 448 x 2 clips at 448
    assert stage_fp8(rec, inv_scale=2.0)[0, 513].item() == 0x7E


def test_both_readers_agree_with_their_loops_on_arbitrary_bytes() -> None:
    gen = torch.Generator().manual_seed(3)
    rec = torch.randint(0, 256, (3, 352), dtype=torch.uint8, generator=gen)
    assert bits(dequant(rec)) == bits(dequant_loop(rec))
    for inv in (1.0, 0.25, 7.0):
        assert torch.equal(stage_fp8(rec, inv_scale=inv), stage_fp8_loop(rec, inv_scale=inv))
