"""A fused fast path for checking the nvfp4_ds_mla gather: every expected row rebuilt and compared in one pass.

The nvfp4 sibling of gather.py (SPEC.md sections 4 and 11.2), and a filter as that one is, not a
second oracle: ``nvfp4_rows_flag`` answers "does dst hold exactly what the exact reader makes of
each row's record?" (bits equal, NaN by position); no sends the case to the full path for the
finding, so it must never say yes wrongly. Each element is the SPEC's arithmetic, exact:

- an e2m1 code is decoded by building its f32 bits from the code's fields (sign, 2-bit exponent of
  bias 1, 1 mantissa bit; exponent 0 is 0 or 0.5): integers only, no SM100 conversion, so it runs
  on an H100 / H200 and under the CPU interpreter alike;
- an e4m3 scale or RoPE byte is decoded as the fp8 check decodes its codes (``_fp8_value``);
- the product of the two is one IEEE f32 multiply (``mul_rn``). It is exact for every pair: at
  most 2 x 4 significant bits, never subnormal in f32 (the smallest non-zero is 2^-10); a NaN
  scale gives NaN, a zero or negative one the IEEE sign. So the f32 -> bf16 rounding has nothing
  to round, and the bits match ``oracles.formats.nvfp4_read.dequant`` for every scale byte,
  0x00..0xFF (tests/fast/test_nvfp4_gather.py holds them over every code x every scale byte);
- a RoPE value is its e4m3 value as bf16 (exact: every e4m3 value is a bf16).

A pair of dst elements (one 32-bit word) is one code byte: its two nibbles, low first, share a
16-value scale block. Rows, the row -> record map (``record_offsets``, any record size), the
prefill that makes one run settle the write map, the packed NaN-by-position compare and the
re-run's compare are the fp8 check's own (gather.py's ``_part``). The record's planes, the scale
block and the scales' permutation come from the format table; a table row this kernel does not
read (another codec, a permutation that is not a transpose) makes the module refuse to import,
and the op then takes the full path.

The unwritten scale class (scale bytes no writer makes: 0x00, NaN, negative) is checked strictly
here too, against the exact IEEE reading; since the contract there is looser (the op row's
``loose``: NaN-ness and sign), a strict mismatch in such a case is "cannot tell" and the full path
judges it (``check``).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from mlafuzz.generators.case import Case
from mlafuzz.generators.ops.nvfp4_gather import Nvfp4Values
from mlafuzz.harness.fast.gather import (
    ROW_DIM,
    _bf16_round,
    _fp8_value,
    _part,
    _usable,
    contiguous_records,
    record_offsets,
)
from mlafuzz.harness.fast.ieee import mul_rn, quiet, use_asm
from mlafuzz.harness.fast.launch import Launchers
from mlafuzz.harness.fast.state import CaseState
from mlafuzz.harness.memory.guards import Guarded
from mlafuzz.harness.ops.op import Outputs
from mlafuzz.oracles.formats import table as formats

FORMAT = formats.get("nvfp4_ds_mla")
RECORD_BYTES = FORMAT.record_bytes
_NOPE, _SCALE, _ROPE = (FORMAT.plane(p) for p in ("nope", "scale", "rope"))
# The kernel's NoPE tile: this many element pairs (code bytes) of each row at a time.
_TILE = 64


def _scale_transpose(slots: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) such that block s's scale is at slot ``cols * (s % rows) + s // rows``: the
    table's permutation as the transpose the kernel computes (nvfp4_ds_mla's 8x4 one; the identity
    is rows = n, cols = 1). ImportError for any other permutation."""
    n = len(slots)
    cols = slots[1] if n > 1 else 1
    rows = n // cols if cols else 0
    if not cols or rows * cols != n or any(slots[s] != cols * (s % rows) + s // rows for s in range(n)):
        raise ImportError(f"{FORMAT.name}: scale slots {slots} are not a transpose this check computes")
    return rows, cols


def _read_layout() -> dict[str, int]:
    """The kernel's layout constexprs from the format table; ImportError where the row is not one
    this kernel reads (its codecs, its tile shapes, its alignment)."""
    rope_pairs = _ROPE.elements // 2
    if (
        (_NOPE.codec, _SCALE.codec, _ROPE.codec) != ("e2m1x2", "e4m3fn", "e4m3fn")
        or FORMAT.row_dim != ROW_DIM  # _usable's row width
        or _NOPE.nbytes % _TILE
        or FORMAT.scale_block % 2  # a code byte's two elements share one scale
        or rope_pairs & (rope_pairs - 1)  # a tl.arange
        or _ROPE.offset % 2  # read as 16-bit words
        or RECORD_BYTES % 16  # rows' records said 16-byte aligned
    ):
        raise ImportError(f"{FORMAT.name}: a layout the fused nvfp4 gather check does not read")
    slot_rows, slot_cols = _scale_transpose(FORMAT.scale_slots)
    return {
        "NOPE_AT": _NOPE.offset,
        "TILE": _TILE,
        "NOPE_TILES": _NOPE.nbytes // _TILE,
        "SCALE_AT": _SCALE.offset,
        "PAIRS_PER_SCALE": FORMAT.scale_block // 2,
        "SLOT_ROWS": slot_rows,
        "SLOT_COLS": slot_cols,
        "ROPE_AT": _ROPE.offset,
        "ROPE_PAIRS": rope_pairs,
    }


LAYOUT = _read_layout()


@triton.jit
def _e2m1_value(code):
    """f32 value of e2m1 code (int32 0..15), exact, from its fields: exponent e = (c >> 1) & 3 of
    bias 1 and mantissa bit m = c & 1 make the f32 exponent field e + 126 and mantissa bit 22;
    e = 0 is the subnormal m x 0.5 (0 or the f32 0.5, 0x3F000000); bit 3 is the sign."""
    e = (code >> 1) & 3
    m = code & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))
    bits = bits | ((code << 28) & (-2147483648))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _bf16_bits(x):
    """bf16 bit pattern (uint32 0..0xFFFF) of f32 x, a NaN as 0x7FC0 (compared by position)."""
    return tl.where(x != x, 0x7FC0, _bf16_round(x)).to(tl.uint32)


@triton.jit
def _nope_pairs(codes, scale, USE_ASM: tl.constexpr):
    """The two bf16 elements (uint32: the even one in the low half) of code bytes ``codes`` (int32
    0..255: the even element in the low nibble) times their block's f32 ``scale``."""
    lo = mul_rn(_e2m1_value(codes & 0xF), scale, USE_ASM)
    hi = mul_rn(_e2m1_value(codes >> 4), scale, USE_ASM)
    return _bf16_bits(lo) | (_bf16_bits(hi) << 16)


@triton.jit
def _rope_pairs(words, USE_ASM: tl.constexpr):
    """The two bf16 elements of two e4m3 RoPE bytes (int32 ``words``: the first in the low byte)."""
    lo = _fp8_value(words & 0xFF, USE_ASM)
    hi = _fp8_value((words >> 8) & 0xFF, USE_ASM)
    return _bf16_bits(lo) | (_bf16_bits(hi) << 16)


# As the fp8 check's kernel: only the row count and the mode (fill, check one run, check two) vary,
# as runtime values (one compiled kernel); the flag's board slot may be any int64 of the board.
@triton.jit(do_not_specialize=["total", "mode"], do_not_specialize_on_alignment=["bad_ptr"])
def _rows(
    cache8_ptr,
    rec_ptr,
    dst_bf16_ptr,
    dst2_bf16_ptr,
    bad_ptr,
    total,
    dst_stride,
    dst2_stride,
    mode,
    ROWS: tl.constexpr,
    USE_ASM: tl.constexpr,
    NOPE_AT: tl.constexpr,
    TILE: tl.constexpr,
    NOPE_TILES: tl.constexpr,
    SCALE_AT: tl.constexpr,
    PAIRS_PER_SCALE: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    SLOT_COLS: tl.constexpr,
    ROPE_AT: tl.constexpr,
    ROPE_PAIRS: tl.constexpr,
):
    """ROWS dst rows per program, each rebuilt from its record (rec: its byte offset in the cache)
    one pair of elements (one code byte) at a time: NOPE_TILES tiles of TILE code bytes, each with
    its block's scale byte read beside it (a byte of the same 32-byte plane: one cache line), then
    the RoPE bytes two at a time; each slice filled or checked by ``_part`` (mode 0 / 1 / 2).
    dst_stride, dst2_stride: in element pairs. A mismatch sets bad[0] = 1 with a masked store."""
    cache16_ptr = cache8_ptr.to(tl.pointer_type(tl.int16))
    dst_ptr = dst_bf16_ptr.to(tl.pointer_type(tl.uint32))
    dst2_ptr = dst2_bf16_ptr.to(tl.pointer_type(tl.uint32))
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rows < total
    rec = tl.multiple_of(tl.load(rec_ptr + rows, mask=live, other=0), 16)  # records are 16-byte aligned
    on = live[:, None]
    pairs = tl.arange(0, TILE)
    nope_bad = tl.zeros((ROWS, TILE), dtype=tl.int1)  # the tiles' mismatches, or-ed elementwise
    for t in tl.static_range(NOPE_TILES):
        k = t * TILE + pairs  # the code byte, and the dst pair it makes
        codes = tl.load(cache8_ptr + rec[:, None] + NOPE_AT + k[None, :], mask=on, other=0).to(tl.int32)
        block = k // PAIRS_PER_SCALE
        slot = SLOT_COLS * (block % SLOT_ROWS) + block // SLOT_ROWS
        raw = tl.load(cache8_ptr + rec[:, None] + SCALE_AT + slot[None, :], mask=on, other=0).to(tl.int32)
        expected = _nope_pairs(codes, _fp8_value(raw, USE_ASM), USE_ASM)
        nope_bad = nope_bad | _part(
            dst_ptr, dst2_ptr, rows, live, dst_stride, dst2_stride, t * TILE, expected, TILE, mode
        )
    rope_at = (rec[:, None] + ROPE_AT) // 2 + tl.arange(0, ROPE_PAIRS)[None, :]
    words = tl.load(cache16_ptr + rope_at, mask=on, other=0).to(tl.int32) & 0xFFFF
    expected = _rope_pairs(words, USE_ASM)
    rope_bad = _part(
        dst_ptr, dst2_ptr, rows, live, dst_stride, dst2_stride, NOPE_TILES * TILE, expected, ROPE_PAIRS, mode
    )
    if mode != 0:
        row_bad = tl.max(nope_bad.to(tl.int32), axis=1) | tl.max(rope_bad.to(tl.int32), axis=1)
        tl.store(bad_ptr + tl.zeros_like(row_bad), 1, mask=row_bad != 0)


# The fp8 check's launch shape (gather.py: 4 rows over 2 warps), not yet tuned for this kernel.
ROWS_PER_PROGRAM = 4
NUM_WARPS = 2


def _launch(
    *,
    mode: int,
    cache: torch.Tensor,
    dst: torch.Tensor,
    dst2: torch.Tensor | None,
    rec: torch.Tensor,
    bad: torch.Tensor,
    launchers: Launchers | None,
) -> None:
    other = dst2 if dst2 is not None else dst
    total = dst.shape[0]
    with quiet():
        constexprs = {"ROWS": ROWS_PER_PROGRAM, "USE_ASM": use_asm(dst.device), **LAYOUT}
        (launchers or Launchers())(_rows)(
            -(-total // ROWS_PER_PROGRAM),  # not triton.cdiv: ~5 us a call
            (cache, rec, dst, other, bad, total, dst.stride(0) // 2, other.stride(0) // 2, mode),
            constexprs,
            num_warps=NUM_WARPS,
        )


def _offsets(
    *,
    cache: torch.Tensor,
    total: int,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None,
    rec: torch.Tensor | None,
    launchers: Launchers | None,
) -> torch.Tensor:
    if rec is not None:
        return rec
    return record_offsets(
        src_cache=cache,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        total=total,
        launchers=launchers,
    )


def nvfp4_prefill(
    *,
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None,
    rec: torch.Tensor | None = None,
    launchers: Launchers | None = None,
) -> bool:
    """Fill dst so that no byte of it already holds what the exact reader puts there (gather.py's
    ``gather_prefill``, for nvfp4 records): a dst that ``nvfp4_rows_flag`` then finds equal to the
    oracle's was written at every byte. False (nothing written) for a layout it does not read."""
    cache = contiguous_records(src_cache, record_bytes=RECORD_BYTES)
    if batch_size <= 0 or not _usable(cache, dst):
        return False
    assert cache is not None
    total = dst.shape[0]
    if total == 0:
        return True
    rec = _offsets(
        cache=cache,
        total=total,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        rec=rec,
        launchers=launchers,
    )
    _launch(mode=0, cache=cache, dst=dst, dst2=None, rec=rec, bad=rec, launchers=launchers)
    return True


def nvfp4_rows_flag(
    *,
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None,
    dst2: torch.Tensor | None = None,
    rec: torch.Tensor | None = None,
    flag: torch.Tensor | None = None,
    launchers: Launchers | None = None,
) -> torch.Tensor | None:
    """A device int [1], nonzero when some dst row (or dst2 row) is not exactly the exact reader's
    row of its record or dst2 is not bit-identical to dst (NaN payloads included), zero when every
    row is; None when this check cannot tell (a layout it does not read). Valid cases only (SPEC
    section 4's preconditions hold). No host sync. ``flag``: a zeroed int tensor on dst's device
    to set (its element 0) instead of a new one."""
    cache = contiguous_records(src_cache, record_bytes=RECORD_BYTES)
    if batch_size <= 0 or (dst2 is not None and dst2.shape != dst.shape) or not _usable(cache, dst, dst2):
        return None
    assert cache is not None
    total = dst.shape[0]
    bad = flag if flag is not None else torch.zeros(1, dtype=torch.int32, device=dst.device)
    if total == 0:
        return bad
    rec = _offsets(
        cache=cache,
        total=total,
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=seq_starts,
        rec=rec,
        launchers=launchers,
    )
    mode = 1 if dst2 is None else 2
    _launch(mode=mode, cache=cache, dst=dst, dst2=dst2, rec=rec, bad=bad, launchers=launchers)
    return bad


# --- the fast path's adapters (harness/fast/path.py) -------------------------------


def _unwritten(case: Case) -> bool:
    return getattr(case.spec, "values", None) is Nvfp4Values.UNWRITTEN


def _args(state: CaseState) -> dict[str, Any]:
    """The check's arguments, prepared once per case for its prefill and its checks: the cache
    contiguous and aligned (a copy only when it is not) and the row -> record map."""
    case = state.case
    t = case.tensors
    args = dict(
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
    )
    if "nvfp4_gather" not in state.memo:
        cache = contiguous_records(t["src_cache"], record_bytes=RECORD_BYTES)
        rec = (
            record_offsets(src_cache=cache, total=case.params["total"], launchers=state.launchers, **args)
            if cache is not None
            else None
        )  # a layout it does not read: prefill and check decline it themselves
        state.memo["nvfp4_gather"] = (cache if cache is not None else t["src_cache"], rec)
    cache, rec = state.memo["nvfp4_gather"]
    return {**args, "src_cache": cache, "rec": rec, "launchers": state.launchers}


def check(case: Case, outputs: Outputs, second: Outputs | None, flag: torch.Tensor, state: CaseState) -> bool:
    """The strict check, for every case. The unwritten scale class (a quarter of the cases) is judged
    by the full path on NaN-ness and sign alone where a scale no writer makes is read (the op row's
    ``loose``), so there a strict mismatch is no verdict: it is raised as "cannot tell" (2 in the
    flag's second slot), and the full path judges the case loosely, with no NONDETERMINISM read
    into the difference. A strict match needs no looser look: the prefill proves every byte was
    written, and the exact IEEE reading passes the loose one."""
    dst = outputs.get("dst")
    dst2 = second.get("dst") if second is not None else None
    if not isinstance(dst, torch.Tensor) or (second is not None and not isinstance(dst2, torch.Tensor)):
        return False
    unwritten = _unwritten(case)
    into = flag[1:2] if unwritten else flag
    if nvfp4_rows_flag(dst=dst, dst2=dst2, flag=into, **_args(state)) is None:
        return False
    if unwritten:
        into.mul_(2)  # one more launch, no sync: 1 -> 2, "cannot tell"
    return True


def prefill(case: Case, guards: Mapping[str, Guarded], state: CaseState) -> bool:
    return nvfp4_prefill(dst=guards["dst"].view, **_args(state))
