"""The planted bugs' code: each is the correct algorithm with one named change (the ``bug``).

The torch variants run anywhere (so the catalog runs on CPU CI); the Triton
variant reproduces a launch bug on the GPU; CUDA kernels with planted bugs are
cuda_mutants.py (mutants.cu), the crashing C++ host check host_throw.py. The catalog (catalog.py) names
them and says which finding each must draw.
"""

from __future__ import annotations

import functools
import struct
from typing import Callable

import torch

from mlafuzz.kernels.checks import (
    InvalidInputError,
    check_block_ids,
    check_convert_args,
    check_gather_args,
    check_gather_host_args,
    check_gather_host_rows,
    check_gather_values,
)
from mlafuzz.kernels.mutants import surface_bugs
from mlafuzz.kernels.revisions import compacts_counted, pow2_scale
from mlafuzz.oracles.formats.table import get as get_format

FLT_MIN = torch.finfo(torch.float32).tiny


def _as_contiguous(t: torch.Tensor, *, rows: int | None = None) -> torch.Tensor:
    """``t``'s first ``rows`` rows read as a kernel that assumes contiguity reads them: from its
    first element, with row stride = its width and column stride 1 (what such a kernel's
    ``ptr + r * width + c`` reads, whatever t's strides are)."""
    n = t.shape[0] if rows is None else rows
    return t.as_strided((n, t.shape[1]), (t.shape[1], 1))


# --- convert -------------------------------------------------------------------


def _convert(
    bug: str,
    req_id,
    block_table,
    token_indices,
    BLOCK_SIZE=64,
    NUM_TOPK_TOKENS=2048,
    BLOCK_N=128,
    HAS_PREFILL_WORKSPACE=False,
    prefill_workspace_request_ids=None,
    prefill_workspace_starts=None,
    return_valid_counts=False,
    *,
    BLOCK_STRIDE_ROWS=None,
    COMPACT_TO_FRONT=False,
    out=None,
    valid_counts_out=None,
    last: surface_bugs.LastOut | None = None,
    revision: str | None = None,
):
    # Compacted when asked, or counted under a revision whose convert_counted rule compacts (as ours).
    compact = bool(COMPACT_TO_FRONT) or (bool(return_valid_counts) and compacts_counted(revision))
    if bug != "no_length_check":
        check_convert_args(
            req_id,
            block_table,
            token_indices,
            BLOCK_SIZE,
            NUM_TOPK_TOKENS,
            BLOCK_N,
            HAS_PREFILL_WORKSPACE,
            prefill_workspace_request_ids,
            prefill_workspace_starts,
            BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
            out=out,
            valid_counts_out=valid_counts_out,
        )
    n = token_indices.shape[0]
    rows = req_id.shape[0] if bug == "no_length_check" else n
    tok = token_indices.long()
    if rows > n:  # the grid covers req_id's rows: rows past the indices read garbage (here: -1)
        tok = torch.cat([tok, tok.new_full((rows - n, tok.shape[1]), -1)])
    req = req_id.long()[:rows, None]
    bs, (num_reqs, width) = BLOCK_SIZE, block_table.shape
    blk = torch.div(tok, bs, rounding_mode="floor")
    off = tok - blk * bs
    if bug == "minus1_only":
        valid = (tok != -1) & (blk < width)  # treats only -1 as padding
    elif bug == "block_edge":
        valid = (tok >= 0) & (blk <= width)  # off by one at the table's edge
    else:
        valid = (tok >= 0) & (blk < width)
    valid &= (req >= 0) & (req < num_reqs)
    if bug == "row_as_request":
        req = torch.arange(rows, device=req.device)[:, None].clamp(max=num_reqs - 1)
    # logical_width: the table addressed by its logical width instead of its row stride (vLLM #55184)
    table = (_as_contiguous(block_table) if bug == "logical_width" else block_table).long()
    entry = table[req.clamp(0, num_reqs - 1), blk.clamp(0, width - 1)]
    stride = bs if BLOCK_STRIDE_ROWS is None or bug == "stride_ignored" else BLOCK_STRIDE_ROWS
    vals = entry * stride + off
    if HAS_PREFILL_WORKSPACE:
        ids = prefill_workspace_request_ids.long()[:rows, None]
        starts = prefill_workspace_starts.long()
        is_pf = ids >= 0
        pf_vals = starts[ids.clamp(0, max(starts.numel() - 1, 0))] + tok if starts.numel() else tok
        vals = torch.where(is_pf, pf_vals, vals)
        valid_pf = (tok >= 0) if bug == "prefill_no_table_bound" else (tok >= 0) & (blk < width)
        in_range = ids < starts.numel()
        valid = torch.where(is_pf, valid_pf & in_range, valid)
    vals = (vals + 2**31) % 2**32 - 2**31  # int32 wraparound, as the kernel computes
    # invalid_to_zero: an invalid column converted to 0 instead of -1 (vLLM #45324: block 0 attended)
    res = torch.where(valid, vals, torch.full_like(vals, 0 if bug == "invalid_to_zero" else -1)).to(torch.int32)[:n]
    filled = valid[:n]  # the output elements holding a valid value
    if compact:
        # compact_hole: the prefix packed from every non-negative token, before the table bound (vLLM
        # #58058): a token past the table leaves its -1 inside the prefix, the count stays right.
        packed = (tok[:n] >= 0) if bug == "compact_hole" else valid[:n]
        res = _compact(res, packed, tile=BLOCK_N if bug == "compact_tile_restart" else None)
        filled = torch.arange(res.shape[1], device=res.device) < valid[:n].sum(dim=1, keepdim=True)
    counted = (token_indices != -1) if bug == "count_all" else valid[:n]
    counts = counted.sum(dim=1).to(torch.int32) if return_valid_counts else None
    # stale_compacted: a compacted call through the out= of the call before writes none of its rows
    # (a reuse check keyed on the caller's buffer, not on the step: SPEC 9.2's conversion cache)
    again = last is not None and out is not None and last.again(out)
    keep = bug == "stale_compacted" and again and compact
    # tail_unwritten is a compacted row's bug: a row kept in place is stored whole.
    planted = bug if compact or bug != "tail_unwritten" else "none"
    return surface_bugs.deliver(planted, res, counts, filled, out, valid_counts_out, keep_out=keep)


def _compact(out: torch.Tensor, valid: torch.Tensor, *, tile: int | None) -> torch.Tensor:
    """Each row's valid values packed at its front, -1 after. ``tile``: the planted bug, packing
    every tile of that many columns from column 0 of the row again, so a later tile's slots land on
    an earlier tile's (and the tail starts after the last tile's count)."""
    n, k = out.shape
    packed = torch.full_like(out, -1)
    step = k if tile is None else tile
    for c0 in range(0, k, step):
        v = valid[:, c0 : c0 + step]
        base = (
            valid[:, :c0].sum(dim=1, keepdim=True)
            if tile is None
            else torch.zeros((n, 1), dtype=torch.int64, device=out.device)
        )
        dest = torch.where(v, base + v.long().cumsum(dim=1) - 1, torch.full_like(v, k, dtype=torch.int64))
        wide = torch.cat([packed, packed.new_full((n, 1), -1)], dim=1)
        wide.scatter_(1, dest, torch.where(v, out[:, c0 : c0 + step], wide.gather(1, dest)))
        packed = wide[:, :k]
    return packed


# --- gather --------------------------------------------------------------------


_FP8 = get_format("fp8_ds_mla")
_NOPE, _SCALE, _ROPE = (_FP8.plane(name) for name in ("nope", "scale", "rope"))


def _dequant(bug: str, records: torch.Tensor) -> torch.Tensor:
    codes = records[:, _NOPE.offset : _NOPE.stop].contiguous().view(torch.float8_e4m3fn).float()
    scales = records[:, _SCALE.offset : _SCALE.stop].contiguous().view(torch.float32)
    tile = torch.arange(_FP8.nope_dim, device=records.device) // _FP8.scale_block
    if bug == "wrong_scale_tile":
        tile = torch.tensor([0, 2, 1, 3], device=records.device)[tile]
    if bug == "scale_inverted":  # the stored scale held to be the writer's inverse (FlashMLA #184)
        prod = codes / scales[:, tile]
    else:
        prod = codes * scales[:, tile]
    if bug == "flush_subnormal":
        prod = torch.where(
            prod.abs() < FLT_MIN, torch.copysign(torch.zeros_like(prod), prod), prod
        )  # signed zero, as FTZ
    if bug == "nan_to_zero":
        prod = torch.nan_to_num(prod, nan=0.0)
    if bug == "truncate_bf16":
        nope = ((prod.view(torch.int32) >> 16).to(torch.int16)).view(torch.bfloat16)
    else:
        nope = prod.to(torch.bfloat16)
    rope = records[:, _ROPE.offset : _ROPE.stop].contiguous().view(torch.int16)
    rope = rope.view(torch.float16).to(torch.bfloat16) if bug == "rope_as_fp16" else rope.view(torch.bfloat16)
    return torch.cat([nope, rope], dim=1)


class Calls:
    """A loaded mutant's own call count (the nondeterminism mutant flips a bit on alternate calls)."""

    def __init__(self) -> None:
        self.n = 0


def _table_bound_without_start(ws: list[int], total: int, block_size: int, max_blocks: int) -> None:
    """vLLM #27909 / #45380's look-alike: the table bound checked on a request's length alone, as if
    every read started at position 0, so a seq_start that pushes the last read past the row is let
    through (every other check stays)."""
    for i, w in enumerate(ws):
        n = (ws[i + 1] if i + 1 < len(ws) else total) - w
        if n and (n - 1) // block_size >= max_blocks:
            raise InvalidInputError(
                "block_index_past_table", f"request {i}: {n} rows need more than {max_blocks} blocks"
            )


def _flat_table_ids(block_table: torch.Tensor, req: torch.Tensor, blk: torch.Tensor) -> torch.Tensor:
    """Block ids read as a kernel without a column bound reads them: element req * row_stride + blk
    of the table's storage, which for blk >= width is a later row's entry (wrapped at the storage's
    end: memory past it holds whatever it holds)."""
    flat = torch.empty(0, dtype=block_table.dtype, device=block_table.device).set_(block_table.untyped_storage())
    at = block_table.storage_offset() + req * block_table.stride(0) + blk * block_table.stride(1)
    return flat[at % flat.numel()].long()


def _tier_records(
    bug: str, cache: torch.Tensor, slots: torch.Tensor, j: torch.Tensor, host_cache, host_row_ids, device_row_ids
) -> torch.Tensor:
    """The host tier's records (SPEC 9.3) with the host-tier bugs planted: the choice inverted, the
    host map indexed by dst row instead of slot, device row 0 taken for "absent", the tier ignored."""
    bs = cache.shape[1]
    host = host_cache.view(torch.uint8).to(cache.device)
    d, h = check_gather_host_rows(
        slots, host_row_ids, device_row_ids, host_rows=host.shape[0], device_rows=cache.shape[0] * bs
    )
    if bug == "host_by_position":  # the host map read at the dst row, not at the source slot
        h = host_row_ids.reshape(-1).long()[j.clamp(max=host_row_ids.numel() - 1)]
    on_device = d > 0 if bug == "device_row0_absent" else d >= 0
    dev_row = torch.where(on_device, d, 0)
    if bug == "host_choice_inverted":  # a device row for the host's slots (the slot itself), the host's for the rest
        on_device, dev_row = ~on_device, slots
    if bug == "host_tier_ignored":
        on_device, dev_row = torch.ones_like(on_device), slots
    h = torch.where(on_device, 0, h).clamp(0, max(host.shape[0] - 1, 0))
    dev_rec = cache[dev_row // bs, dev_row % bs]
    host_rec = host[h] if host.shape[0] else torch.zeros_like(dev_rec)
    return torch.where(on_device[:, None], dev_rec, host_rec)


def _gather(
    bug: str,
    src_cache,
    dst,
    block_table,
    workspace_starts,
    batch_size,
    seq_starts=None,
    host_cache=None,
    host_row_ids=None,
    device_row_ids=None,
    *,
    calls: Calls | None = None,
):
    check_gather_args(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    tiered = check_gather_host_args(src_cache, host_cache, host_row_ids, device_row_ids)
    num_blocks, bs, _ = src_cache.shape
    total, b = dst.shape[0], batch_size
    ws_l = workspace_starts[:b].tolist()
    ss_l = [0] * b if seq_starts is None or bug == "no_seq_starts" else seq_starts[:b].tolist()
    if bug == "seq_start_past_row":
        check_gather_values(ws=ws_l, seq_starts=ss_l, total=total, block_size=bs, max_blocks=1 << 62)
        _table_bound_without_start(ws_l, total, bs, block_table.shape[1])
    elif bug != "no_value_checks":
        check_gather_values(ws=ws_l, seq_starts=ss_l, total=total, block_size=bs, max_blocks=block_table.shape[1])
    if total == 0:
        return
    if bug == "contiguous_table":  # its row stride taken to be its width (a column slice reads the wrong rows)
        block_table = _as_contiguous(block_table)
    dev = dst.device
    ws = torch.tensor(ws_l, dtype=torch.int64, device=dev)
    j = torch.arange(total, dtype=torch.int64, device=dev)
    req = torch.searchsorted(ws, j, right=(bug != "empty_request_owner")) - 1
    req = req.clamp(0, b - 1)
    pos = torch.tensor(ss_l, dtype=torch.int64, device=dev)[req] + (j - ws[req])
    blk = torch.div(pos, bs, rounding_mode="floor")
    if bug == "seq_start_past_row":
        ids = _flat_table_ids(block_table, req, blk)
    else:
        ids = block_table.long()[req, blk.clamp(0, block_table.shape[1] - 1)]
    if bug != "no_value_checks":
        check_block_ids(ids, num_blocks)
    ids = ids.clamp(0, num_blocks - 1)
    cache = src_cache.view(torch.uint8)
    if tiered:
        records = _tier_records(bug, cache, ids * bs + pos - blk * bs, j, host_cache, host_row_ids, device_row_ids)
    else:
        records = cache[ids, pos - blk * bs]
    rows = _dequant(bug, records)
    if bug == "skip_last_row":
        rows, dst_rows = rows[:-1], dst[:-1]
    elif bug == "dst_storage_start":  # rows written from the storage's first element, not dst's own
        dst_rows = dst.as_strided(dst.shape, dst.stride(), 0)
    else:
        dst_rows = dst
    dst_rows.copy_(rows)
    if bug == "one_row_too_far":  # writes the row after the last one: into whatever follows dst
        past = dst.as_strided((1, dst.shape[1]), dst.stride(), dst.storage_offset() + total * dst.stride(0))
        past.copy_(rows[-1:])
    if bug == "nondeterministic" and calls is not None:
        calls.n += 1
        if calls.n % 2 == 0:
            dst.view(torch.int16)[0, 0] ^= 1
    if bug == "mutates_cache":
        src_cache.view(torch.uint8)[ids[:1], (pos - blk * bs)[:1]] = 0


# --- writer --------------------------------------------------------------------

# The C literal 1e-4f, from its bits (a float64 that is exactly that float32).
F32_1E_4: float = struct.unpack("<f", struct.pack("<I", 0x38D1B717))[0]


def _amax(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), torch.zeros_like(x), x.abs()).amax(dim=2)  # fmaxf drops NaN


def _over_448(v: torch.Tensor) -> torch.Tensor:
    return v / torch.full_like(v, 448.0)


def _floored(v: torch.Tensor, floor: float) -> torch.Tensor:
    return torch.maximum(v, torch.full_like(v, floor))


def _pow2(s: torch.Tensor, rounding: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    return torch.exp2(rounding(torch.log2(s)))  # vLLM's spelling, exp2f(ceilf(log2f(s))), in float32


def _revision_scale(amax: torch.Tensor, revision: str) -> torch.Tensor:
    """The revision's own scale rule, from a (possibly wrong) amax."""
    if not pow2_scale(revision):
        return _floored(_over_448(amax), FLT_MIN)
    return _pow2(_floored(_over_448(amax), F32_1E_4), torch.ceil)


def _fp16_bits_amax(kv_c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """vLLM's fp16 amax: fabsf of each element's raw 16-bit pattern read as an unsigned integer
    (its fp16 dispatch type is uint16_t), so the tile max is over integers up to 65535; bf16 is
    read by value there, as here."""
    if kv_c.dtype != torch.float16:
        return _amax(x)
    raw = kv_c.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return raw.to(torch.float32).view(x.shape).amax(dim=2)


# bug -> (x [n, 4, 128] as f32, kv_c, the revision) -> the tile scales it stores [n, 4]
SCALE_BUGS: dict[str, Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]] = {
    # 2026-07: a rounded-up power-of-two scale, as some FP8 recipes (and 2026-09) use.
    "scale_pow2": lambda x, kv_c, rev: _pow2(_floored(_over_448(_amax(x)), FLT_MIN), torch.ceil),
    # 2026-09: the power of two below, not above: codes of the largest values saturate.
    "round_down": lambda x, kv_c, rev: _pow2(_floored(_over_448(_amax(x)), F32_1E_4), torch.floor),
    # 2026-09: the 1e-4 floor applied to amax, before the division, instead of to the scale.
    "floor_on_amax": lambda x, kv_c, rev: _pow2(_over_448(_floored(_amax(x), F32_1E_4)), torch.ceil),
    # 2026-09: floored, but never rounded to a power of two.
    "no_ceiling": lambda x, kv_c, rev: _floored(_over_448(_amax(x)), F32_1E_4),
    # Either revision: amax from the fp16 bit patterns, as vLLM's native writer does.
    "fp16_bits": lambda x, kv_c, rev: _revision_scale(_fp16_bits_amax(kv_c, x), rev),
}


def _writer(
    bug: str, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None, skip_scale=False, *,
    revision: str,
):  # fmt: skip
    """The writer of ``revision`` with one ``bug``: a wrong tile scale (``SCALE_BUGS``, codes then
    made from it correctly), a wrong slot, or a look-alike of a reported bug: ``padding_nan_slot0``
    (padding rows, their activations NaN, written to the reserved slot 0: sglang #36207),
    ``layer_base_offset`` (the records written from the start of the cache's storage, not its view:
    every layer of a packed cache lands on layer 0, vLLM #57019), ``skip_scale_tile``
    (``skip_scale`` taken to skip the per-tile scales too: raw values saturated, scales stored 1.0)."""
    from mlafuzz.kernels.torch_impl import check_writer_call, records_with_scales, writer_torch

    check_writer_call(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)  # the one bug is below, not here
    if bug == "contiguous_kv_c":  # [T, 512] / [T, 64] taken to be contiguous: views of one [T, 576] read wrong
        n = slot_mapping.shape[0]
        return writer_torch(
            _as_contiguous(kv_c, rows=n),
            _as_contiguous(k_pe, rows=n),
            kv_cache,
            slot_mapping,
            kv_cache_dtype,
            scale,
            revision=revision,
        )
    n = slot_mapping.shape[0]
    kv, pe = kv_c[:n], k_pe[:n]
    if bug == "padding_nan_slot0":  # padded rows hold NaN (never computed) and go to slot 0
        # RoPE too: every padded row is then the same record, so which one lands last in slot 0 does
        # not matter (the report's bug is the write, not a race between the padded rows).
        pad = (slot_mapping < 0)[:, None]
        kv = torch.where(pad, torch.full_like(kv, float("nan")), kv)
        pe = torch.where(pad, torch.full_like(pe, float("nan")), pe)
    if bug == "layer_base_offset":  # the view's storage offset dropped: layer 0 of a packed cache
        kv_cache = torch.as_strided(kv_cache, kv_cache.shape, kv_cache.stride(), 0)
    if bug == "skip_scale_tile" and skip_scale:
        s = torch.ones((n, 4), dtype=torch.float32, device=kv.device)
    elif bug in SCALE_BUGS:
        s = SCALE_BUGS[bug](kv.float().reshape(n, 4, 128), kv, revision).to(torch.float32)
    else:
        from mlafuzz.kernels.torch_impl import tile_scales_torch

        s = tile_scales_torch(kv, revision=revision)
    records = records_with_scales(kv, pe, scale=s)
    slots = slot_mapping.long()
    flat = kv_cache.view(-1, _FP8.record_bytes)
    if bug == "padding_nan_slot0":
        # The real rows first, then the padded ones at slot 0, in that order: a real token whose slot
        # is 0 is overwritten every time, never in a racy order (an index_put with repeats is not).
        keep = slots >= 0
        flat[slots[keep]] = records[keep]
        if bool((~keep).any()):
            flat[0] = records[~keep][-1]
        return
    if bug == "writes_padding":
        slots = slots.clamp(min=0)
    keep = slots >= 0
    flat[slots[keep]] = records[keep]


def _triton_overwide(
    req_id,
    block_table,
    token_indices,
    BLOCK_SIZE=64,
    NUM_TOPK_TOKENS=2048,
    BLOCK_N=128,
    HAS_PREFILL_WORKSPACE=False,
    prefill_workspace_request_ids=None,
    prefill_workspace_starts=None,
    return_valid_counts=False,
    *,
    revision: str | None = None,
):
    """The pre-#48642 bug in the real Triton kernel: grid over req_id rows, out sized from token_indices
    (a counted row compacted as ours under ``revision``)."""
    from mlafuzz.kernels import triton_convert as tc

    n, k = token_indices.shape
    out = torch.empty((n, k), dtype=torch.int32, device=token_indices.device)
    counts = torch.empty((n,), dtype=torch.int32, device=token_indices.device) if return_valid_counts else None
    if req_id.shape[0]:
        tc.launch(
            req_id,
            block_table,
            token_indices,
            out,
            counts,
            BLOCK_SIZE=BLOCK_SIZE,
            BLOCK_N=BLOCK_N,
            HAS_PREFILL_WORKSPACE=HAS_PREFILL_WORKSPACE,
            prefill_workspace_request_ids=prefill_workspace_request_ids,
            prefill_workspace_starts=prefill_workspace_starts,
            grid_rows=req_id.shape[0],
            COMPACT_TO_FRONT=bool(return_valid_counts) and compacts_counted(revision),
        )
    return (out, counts) if return_valid_counts else out


FUNCS: dict[str, Callable] = {
    "convert": _convert,
    "gather": _gather,
    "writer": _writer,
    "dcp": surface_bugs.dcp,
    "dcp_peer": surface_bugs.dcp_peer,
}


def load(op: str, bug: str | None, *, revision: str | None = None) -> Callable:
    """A fresh callable of op's planted ``bug`` (fresh: a stateful bug's state is its own);
    ``revision``: the contract revision a writer mutant is pinned to (None: the caller binds one)."""
    if op == "gather":
        return functools.partial(_gather, bug, calls=Calls())
    if op == "convert" and bug == "stale_compacted":
        return functools.partial(_convert, bug, last=surface_bugs.LastOut())
    if op == "convert" and bug in surface_bugs.RELEASE_BUGS:  # our torch convert, one argument dropped
        return functools.partial(surface_bugs.convert_release, bug)
    if revision is not None:
        return functools.partial(FUNCS[op], bug, revision=revision)
    return functools.partial(FUNCS[op], bug)


def triton_overwide() -> Callable:
    return _triton_overwide
