"""Our torch nvfp4_ds_mla writer (SPEC.md section 11.3): vLLM's ``concat_and_cache_mla(kv_c,
k_pe, kv_cache, slot_mapping, kv_cache_dtype="nvfp4_ds_mla", scale)``, under one of the writer
revisions of ``oracles.formats.writer_rules`` (a table kernels may read, like the format table).

Written from the rules, not from the oracles (the no-borrowing contract). Per 16-value tile x
(f32 of kv_c): amax = max |x_i| with NaN dropped; sf = e4m3_rn_satfinite(max(amax / 6, 2^-9))
(a division by a tensor: torch may turn a division by a Python scalar into a multiply), bumped to
the next e4m3 up under ``rn_bump`` when it fell below that and is not 448; codes e2m1_rn_satfinite
of x * f32(1 / sf) (``mul_recip``) or x / sf (``div``), a NaN's code 0; RoPE e4m3_rn_satfinite of
k_pe. A slot < 0 writes nothing. Records land in the format table's layout (the scale of block s
at its permuted byte).
"""

from __future__ import annotations

import torch

from mlafuzz.kernels.checks import InvalidInputError, check_writer_args
from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.table import get

__all__ = ["writer_nvfp4_torch", "encode_records", "e2m1_codes", "e4m3_bytes"]

FORMAT = get("nvfp4_ds_mla")
_E4M3_MAX = 448.0
_E4M3_MAX_BYTE = 0x7E
_E4M3_NAN = 0x7F
_E2M1_MAX = 6.0
_SCALE_FLOOR = 2.0**-9
# Midpoints between e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}: midpoint i lies between codes i
# and i + 1, and a tie goes to the even code (an even code has mantissa 0).
_E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """f32 -> e4m3fn bytes: nearest, ties to even, saturating at +-448, NaN -> 0x7F."""
    b = torch.clamp(x, -_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(x), torch.full_like(b, _E4M3_NAN), b)


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """f32 -> e2m1 codes (int64): nearest, ties to even, saturating at 6; a NaN's code is 0."""
    nan = torch.isnan(q)
    a = torch.where(nan, torch.zeros_like(q), q.abs())
    code = torch.zeros_like(a, dtype=torch.int64)
    for i, mid in enumerate(_E2M1_MIDS):
        code += (a > mid) if i % 2 == 0 else (a >= mid)
    return code | ((torch.signbit(q) & ~nan).long() << 3)


def _scales(x: torch.Tensor, *, bump: bool) -> torch.Tensor:
    """The scale bytes, uint8 [T, 32, 1], of tiles x [T, 32, 16] (f32)."""
    absx = x.abs()
    amax = torch.where(torch.isnan(absx), torch.zeros_like(absx), absx).amax(dim=-1, keepdim=True)
    target = torch.maximum(amax / torch.full_like(amax, _E2M1_MAX), torch.full_like(amax, _SCALE_FLOOR))
    sf = e4m3_bytes(target)
    if bump:
        below = (sf.view(torch.float8_e4m3fn).float() < target) & (sf < _E4M3_MAX_BYTE)
        sf = sf + below.to(torch.uint8)
    return sf


def encode_records(kv_c: torch.Tensor, k_pe: torch.Tensor, *, revision: str = writer_rules.DEFAULT) -> torch.Tensor:
    """Records uint8 [T, 352] of kv_c [T, 512] and k_pe [T, 64] under writer revision ``revision``."""
    rev = writer_rules.get(revision)
    n = kv_c.shape[0]
    x = kv_c.float().reshape(n, FORMAT.scales, FORMAT.scale_block)
    sf = _scales(x, bump=rev.rule("scale_rounding") == "rn_bump")
    s = sf.view(torch.float8_e4m3fn).float()
    q = x * (torch.ones_like(s) / s) if rev.rule("quotient") == "mul_recip" else x / s
    codes = e2m1_codes(q).reshape(n, FORMAT.nope_dim)
    nope, scale, rope = (FORMAT.plane(p) for p in ("nope", "scale", "rope"))
    rec = torch.empty((n, FORMAT.record_bytes), dtype=torch.uint8, device=kv_c.device)
    rec[:, nope.offset : nope.stop] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    rec[:, rope.offset : rope.stop] = e4m3_bytes(k_pe.float())
    slots = torch.tensor(FORMAT.scale_slots, dtype=torch.int64, device=kv_c.device)
    placed = torch.empty((n, FORMAT.scales), dtype=torch.uint8, device=kv_c.device)
    placed[:, slots] = sf.reshape(n, FORMAT.scales)  # block s's scale at its permuted slot
    rec[:, scale.offset : scale.stop] = placed
    return rec


def writer_nvfp4_torch(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "nvfp4_ds_mla",
    scale: torch.Tensor | None = None,
    *,
    revision: str = writer_rules.DEFAULT,
) -> None:
    """Writes token i's record at slot_mapping[i] (>= 0) in place. Refuses, before writing: another
    kv_cache_dtype, wrong dtypes, shapes (352-byte records), devices, a slot past the cache.
    ``scale`` is accepted and not read (vLLM's nvfp4 writer computes its own scales)."""
    del scale
    check_writer_args(
        kv_c,
        k_pe,
        kv_cache,
        slot_mapping,
        kv_cache_dtype,
        record_format="nvfp4_ds_mla",
        record_bytes=FORMAT.record_bytes,
    )
    num_blocks, bs, _ = kv_cache.shape
    slots = slot_mapping.long()
    if slots.numel() and bool((slots >= 0).any()) and int(slots.max()) >= num_blocks * bs:
        raise InvalidInputError("slot_past_cache", f"slot_mapping max={int(slots.max())} >= {num_blocks * bs}")
    tok = torch.nonzero(slots >= 0).reshape(-1)
    if tok.numel() == 0:
        return
    records = encode_records(kv_c[tok], k_pe[tok], revision=revision)
    kv_cache.view(torch.uint8).view(num_blocks * bs, FORMAT.record_bytes)[slots[tok]] = records
