"""A fused fast path for checking gather: recompute every expected row and compare, in one pass.

This is a filter, not a second oracle: ``gather_rows_match`` answers "does dst
hold exactly what SPEC section 4 says?" (bits equal, NaN by position). When it
answers yes the harness skips the vectorized oracle and the comparator; when it
answers no, they run and produce the finding. So it must never say yes
wrongly; each step is the SPEC's own arithmetic, spelled so nothing can bend it:

- the fp8 code is decoded through a 256-entry f32 table built by the oracle's
  codec (``codec.FP8_TABLE``-style: torch's own e4m3fn decode, exact);
- the product with the f32 scale is one IEEE multiply rounded to nearest even,
  subnormals kept: on the GPU written as the PTX instruction ``mul.rn.f32``
  (no ``.ftz``, no contraction possible), under the CPU interpreter numpy's f32
  multiply (IEEE, no flush);
- f32 -> bf16 is the integer round-to-nearest-even on the bits (NaN is compared
  by position, so its payload never matters).

Held bit-identical to ``oracles.codec.dequant_records`` by tests over all 256
codes and random and extreme scale bit patterns, on the CPU (interpreter) and on
the GPU (the mul.rn.f32 path) (tests/test_oracles_fast_gather.py).

Cost: one read of each record and dst row with vector loads, a table lookup and
a multiply per element: about one pass over the bytes the kernel moved.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

ROW_DIM = 576
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _mul_rn(a, b, USE_ASM: tl.constexpr):
    """IEEE f32 a * b, round to nearest even, subnormals kept."""
    if USE_ASM:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return a * b


@triton.jit
def _bf16_bits(x):
    """bf16 bit pattern (int32 0..0xFFFF) of f32 x, round to nearest even; NaN -> 0x7FC0."""
    f = x.to(tl.uint32, bitcast=True)
    b = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).to(tl.int32)
    return tl.where(x != x, 0x7FC0, b)


@triton.jit
def _is_nan_bf16(bits):
    return ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)


@triton.jit
def _check_rows(cache8_ptr, cache16_ptr, cache32_ptr, lut_ptr, dst_ptr, table_ptr, ws_ptr, ss_ptr, bad_ptr,
                batch_size, block_size, table_stride, table_stride1, dst_stride,
                HAS_SS: tl.constexpr, BLOCK_B: tl.constexpr, USE_ASM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    # The owner: the last request whose start is <= row (empty requests own nothing).
    bidx = tl.arange(0, BLOCK_B)
    ws = tl.load(ws_ptr + bidx, mask=bidx < batch_size, other=2**31 - 1).to(tl.int64)
    owner = tl.max(tl.where(ws <= row, bidx, -1), axis=0)
    start = tl.max(tl.where(bidx == owner, ws, -(2**62)), axis=0)
    seq_start = 0
    if HAS_SS:
        seq_start = tl.load(ss_ptr + owner).to(tl.int64)
    pos = seq_start + row - start
    blk = tl.load(table_ptr + owner * table_stride + (pos // block_size) * table_stride1).to(tl.int64)
    # Byte offset of the record: a multiple of 16 (656 = 41 x 16), said so the loads vectorize.
    rec = tl.multiple_of((blk * block_size + pos % block_size) * 656, 16)
    # NoPE: 512 codes x their tile's scale.
    cols = tl.arange(0, 512)
    code = tl.load(cache8_ptr + rec + cols).to(tl.int32)
    scale = tl.load(cache32_ptr + (rec + 512) // 4 + cols // 128).to(tl.float32, bitcast=True)
    expected = _bf16_bits(_mul_rn(tl.load(lut_ptr + code), scale, USE_ASM))
    actual = tl.load(dst_ptr + row * dst_stride + cols).to(tl.int32) & 0xFFFF
    e_nan = _is_nan_bf16(expected)
    a_nan = _is_nan_bf16(actual)
    bad = tl.sum(((e_nan != a_nan) | (~e_nan & ~a_nan & (expected != actual))).to(tl.int32), axis=0)
    # RoPE: the record's 64 16-bit patterns as they are.
    rcols = tl.arange(0, 64)
    rope = tl.load(cache16_ptr + (rec + 528) // 2 + rcols).to(tl.int32) & 0xFFFF
    ract = tl.load(dst_ptr + row * dst_stride + 512 + rcols).to(tl.int32) & 0xFFFF
    r_nan, ra_nan = _is_nan_bf16(rope), _is_nan_bf16(ract)
    bad += tl.sum(((r_nan != ra_nan) | (~r_nan & ~ra_nan & (rope != ract))).to(tl.int32), axis=0)
    tl.store(bad_ptr + row, bad)


_LUTS: dict[torch.device, torch.Tensor] = {}


def _fp8_lut(device: torch.device) -> torch.Tensor:
    """f32 value of each e4m3fn code (NaN for 0x7F/0xFF), by torch's own exact decode."""
    lut = _LUTS.get(device)
    if lut is None:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        lut = _LUTS[device] = codes.view(torch.float8_e4m3fn).to(torch.float32).to(device)
    return lut


def gather_rows_match(*, src_cache: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor,
                      workspace_starts: torch.Tensor, batch_size: int, seq_starts: torch.Tensor | None) -> bool:
    """True when every dst row holds exactly its expected dequantized record (SPEC section 4).

    Preconditions of SPEC section 4 are assumed to hold (the fuzz loop only calls
    this on valid cases); False means "run the full oracle and comparator".
    """
    total = dst.shape[0]
    if total == 0:
        return True
    if batch_size <= 0 or batch_size > 4096:
        return False  # outside this filter's tiling: let the full path decide
    cache = src_cache.view(torch.uint8)
    if not cache.is_contiguous() or cache.data_ptr() % 16:
        cache = cache.clone(memory_format=torch.contiguous_format)  # the typed views below need alignment
    flat = cache.reshape(-1)
    bits = dst.view(torch.int16)
    if bits.stride(1) != 1:
        return False  # only contiguous rows are read here: let the full path decide
    ws = workspace_starts[:batch_size].contiguous()
    ss = seq_starts[:batch_size].contiguous() if seq_starts is not None else ws
    bad = torch.empty(total, dtype=torch.int32, device=dst.device)
    _check_rows[(total,)](flat, flat.view(torch.int16), flat.view(torch.int32), _fp8_lut(dst.device), bits,
                          block_table, ws, ss, bad, batch_size, cache.shape[1], block_table.stride(0),
                          block_table.stride(1), bits.stride(0), HAS_SS=seq_starts is not None,
                          BLOCK_B=triton.next_power_of_2(batch_size),
                          USE_ASM=dst.is_cuda and not _INTERPRETED, num_warps=4)
    return not bool(bad.any())
