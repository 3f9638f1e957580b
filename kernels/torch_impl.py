"""Torch implementations of convert, gather and the fp8_ds_mla writer.

Written the way an implementation would be (vectorized torch on the inputs'
own device, CPU or CUDA), not by calling the oracles: the differential tests
hold them against ``mlafuzz.oracles``. Signatures are SPEC.md's (§3, §4, §2).

Host checks live in ``checks.py``; the ``*_REJECTS`` constants name the
invalid-input classes each function promises to reject before writing.
"""

from __future__ import annotations

import torch

from mlafuzz.kernels.checks import (
    CONVERT_REJECTS,
    GATHER_TORCH_REJECTS,
    NOPE_DIM,
    RECORD_BYTES,
    ROPE_DIM,
    WRITER_TORCH_REJECTS,
    InvalidInputError,
    check_block_ids,
    check_convert_args,
    check_dcp_filter_args,
    check_dcp_peer_args,
    check_gather_args,
    check_gather_host_args,
    check_gather_host_rows,
    check_gather_values,
    check_release_args,
    check_writer_args,
)
from mlafuzz.kernels.revisions import (
    NEWEST,
    WRITER_REVISIONS,
    check_revision,
    compacts_counted,
    filter_compacts,
    scale_of,
)

__all__ = [
    "convert_torch",
    "filter_and_convert_dcp_torch",
    "dcp_peer_slots_torch",
    "gather_torch",
    "writer_torch",
    "dequant_records_torch",
    "encode_records_torch",
    "CONVERT_REJECTS",
    "GATHER_TORCH_REJECTS",
    "WRITER_TORCH_REJECTS",
    "WRITER_REVISIONS",
    "tile_scales_torch",
]

_TILE = 128  # NoPE elements per scale
_NUM_TILES = NOPE_DIM // _TILE
_FP8_MAX = 448.0
_FP8_NAN_CODE = 0x7F  # what __nv_cvt_float_to_fp8(NaN, __NV_SATFINITE, E4M3) gives


# ---------------------------------------------------------------- convert (§3)


def convert_torch(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    BLOCK_SIZE: int = 64,
    BLOCK_STRIDE_ROWS: int | None = None,
    NUM_TOPK_TOKENS: int = 2048,
    BLOCK_N: int = 128,
    HAS_PREFILL_WORKSPACE: bool = False,
    prefill_workspace_request_ids: torch.Tensor | None = None,
    prefill_workspace_starts: torch.Tensor | None = None,
    return_valid_counts: bool = False,
    *,
    COMPACT_TO_FRONT: bool = False,
    out: torch.Tensor | None = None,
    valid_counts_out: torch.Tensor | None = None,
    revision: str | None = None,
    idx_mapping: torch.Tensor | None = None,
    prefill_workspace_rank_stride: int | None = None,
    dcp_size: int = 1,
    dcp_rank: int = 0,
    cp_kv_cache_interleave_size: int = 1,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SPEC §3 in vectorized torch; same contract as ``triton_convert.convert``.

    Rejects ``CONVERT_REJECTS`` on the host. Like the Triton kernel, a row
    whose req lies outside [0, R), or a prefill row whose workspace id lies
    outside [0, len(starts)), yields -1 where it would have read out of bounds.
    Arithmetic is int32 and wraps like the kernel's. The SPEC §7 options:
    ``BLOCK_STRIDE_ROWS`` (None = BLOCK_SIZE) multiplies the table entry of a
    cache slot; ``COMPACT_TO_FRONT`` packs each row's valid values at its
    front (column order, by a stable sort on "invalid"), -1 after. ``out`` /
    ``valid_counts_out`` (SPEC 9.2): the caller's buffers, every element written and returned
    (valid_counts_out only when counts are returned, as in vLLM). ``revision``: the contract
    revision whose ``convert_counted`` rule it follows (``compact``: a counted row is compacted as
    by COMPACT_TO_FRONT, vLLM 0.30.0 on); None: in place. The releases' arguments (SPEC 10):
    ``idx_mapping`` (a decode row's table row is ``max(idx_mapping[req], 0)``), and the DCP
    layout: a decode token of another rank is -1; a prefill token of any rank is valid at
    ``owner * prefill_workspace_rank_stride + start + local``; bounds on the local index.
    """
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
    d, rank, inter, rank_stride = check_release_args(
        idx_mapping=idx_mapping,
        dcp_size=dcp_size,
        dcp_rank=dcp_rank,
        interleave=cp_kv_cache_interleave_size,
        rank_stride=prefill_workspace_rank_stride,
        device=token_indices.device,
    )
    num_reqs, max_blocks = block_table.shape
    stride = BLOCK_SIZE if BLOCK_STRIDE_ROWS is None else BLOCK_STRIDE_ROWS
    tok = token_indices
    nonneg = tok >= 0
    tok_s = torch.where(nonneg, tok, 0).long()  # divide non-negative values only
    group = torch.div(tok_s, inter, rounding_mode="floor")  # DCP: the token's owner and local index
    owner = group % d
    local = torch.div(group, d, rounding_mode="floor") * inter + tok_s % inter
    blk = torch.div(local, BLOCK_SIZE, rounding_mode="floor")
    off = local - blk * BLOCK_SIZE
    in_table = nonneg & (blk < max_blocks)

    req = req_id.long()
    if idx_mapping is not None:  # the table row through the mapping; a negative entry reads row 0
        inside = (req >= 0) & (req < idx_mapping.shape[0])
        mapped = idx_mapping.long()[torch.where(inside, req, 0)].clamp(min=0) if idx_mapping.numel() else req
        req = torch.where(inside, mapped, -1)
    req_ok = (req >= 0) & (req < num_reqs)
    valid = in_table & req_ok[:, None] & (owner == rank)  # another rank's decode token: invalid
    if max_blocks > 0 and num_reqs > 0:
        rows = torch.where(req_ok, req, 0)[:, None]
        cols = torch.where(valid, blk, 0).long()
        base = block_table[rows, cols]  # every index is in range by construction
    else:
        base = torch.zeros_like(tok)
    # int32 * python int stays int32 on the CPU; wrap explicitly all the same, so no device or
    # torch version can promote the product and skip the kernel's int32 wraparound.
    val = _wrap_int32(base.long() * stride + off.long())

    if HAS_PREFILL_WORKSPACE:
        pref = prefill_workspace_request_ids.long()
        starts = prefill_workspace_starts
        is_pref = pref >= 0
        pref_ok = is_pref & (pref < starts.shape[0])
        if starts.shape[0] > 0:
            pstart = torch.where(pref_ok, starts[torch.where(pref_ok, pref, 0)], 0)
        else:
            pstart = torch.zeros_like(req_id)
        pval = owner * rank_stride + pstart[:, None].long() + local  # the rank-major workspace
        val = torch.where(is_pref[:, None], _wrap_int32(pval), val)
        valid = torch.where(is_pref[:, None], in_table & pref_ok[:, None], valid)

    res = torch.where(valid, val, -1).to(torch.int32)
    if (COMPACT_TO_FRONT or (return_valid_counts and compacts_counted(revision))) and res.numel():
        # A stable sort on "invalid" moves the valid columns to the front, keeping their order.
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
        res = torch.gather(res, 1, order)
    return _into(res, valid.sum(dim=1, dtype=torch.int32) if return_valid_counts else None, out, valid_counts_out)


def _into(
    res: torch.Tensor, counts: torch.Tensor | None, out: torch.Tensor | None, valid_counts_out: torch.Tensor | None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The result in the caller's buffers where given (SPEC 9.2), else fresh contiguous tensors."""
    res = res.contiguous() if out is None else out.copy_(res)
    if counts is None:
        return res
    return res, counts if valid_counts_out is None else valid_counts_out.copy_(counts)


def _owner_local(token_indices: torch.Tensor, dcp_size: int, interleave: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC 9.4: each token's owning rank and its index in that rank's share (int64; negative
    tokens read as 0, the caller masks them)."""
    t = token_indices.long().clamp(min=0)
    group = torch.div(t, interleave, rounding_mode="floor")
    local = torch.div(group, dcp_size, rounding_mode="floor") * interleave + t % interleave
    return group % dcp_size, local


def filter_and_convert_dcp_torch(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    dcp_size: int,
    dcp_rank: int,
    cp_kv_cache_interleave_size: int = 1,
    BLOCK_SIZE: int = 64,
    BLOCK_STRIDE_ROWS: int | None = None,
    NUM_TOPK_TOKENS: int = 2048,
    BLOCK_N: int = 128,
    return_valid_counts: bool = False,
    compact_valid_to_front: bool = True,
    *,
    revision: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SPEC 9.4's filter (vLLM's ``triton_filter_and_convert_dcp_index`` signature): this rank's
    tokens as local indices, the others -1, then the plain convert of them (``BLOCK_STRIDE_ROWS``
    passed on). Compacted as kernels/revisions.py ``filter_compacts`` says (D == 1: vLLM's hand-off
    to the plain convert, under ``revision``'s ``convert_counted``)."""
    check_dcp_filter_args(
        req_id, block_table, token_indices, dcp_size, dcp_rank, cp_kv_cache_interleave_size, BLOCK_SIZE,
        NUM_TOPK_TOKENS, BLOCK_N, BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
    )  # fmt: skip
    owner, local = _owner_local(token_indices, dcp_size, cp_kv_cache_interleave_size)
    mine = (token_indices >= 0) & (owner == dcp_rank)
    local_indices = torch.where(mine, local, -1).to(torch.int32)  # local <= token: it fits
    return convert_torch(
        req_id,
        block_table,
        local_indices,
        BLOCK_SIZE,
        BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
        NUM_TOPK_TOKENS=NUM_TOPK_TOKENS,
        BLOCK_N=BLOCK_N,
        return_valid_counts=return_valid_counts,
        COMPACT_TO_FRONT=filter_compacts(dcp_size, compact_valid_to_front, return_valid_counts, revision),
    )


def dcp_peer_slots_torch(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    dcp_size: int,
    blocks_per_peer: int,
    cp_kv_cache_interleave_size: int = 1,
    block_size: int = 64,
    BLOCK_N: int = 64,
    return_valid_counts: bool = False,
    out: torch.Tensor | None = None,
    valid_counts_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SPEC 9.4's peer-slot map (vLLM's ``convert_global_indices_to_dcp_peer_slots`` signature):
    each valid token's slot in the rank-major view of every rank's cache; the caller's buffers
    where given (SPEC 9.2)."""
    check_dcp_peer_args(
        req_id, block_table, token_indices, dcp_size, blocks_per_peer, cp_kv_cache_interleave_size, block_size,
        BLOCK_N, out, valid_counts_out,
    )  # fmt: skip
    # Few, whole-tensor ops (each is a launch on a GPU, and this op's cost is its launches), all in
    # int32. The interleave divides the block size (checked), so a local block holds bs // I whole
    # groups of a rank's I tokens: token t's local block is t // (D * bs), and its owner and row in
    # that block depend on u = t % (D * bs) alone. A negative token gives a negative block.
    d, i, bs, p = dcp_size, cp_kv_cache_interleave_size, block_size, blocks_per_peer
    t = token_indices
    lb = torch.div(t, d * bs, rounding_mode="floor")
    u = t % (d * bs)
    group = torch.div(u, i, rounding_mode="floor")
    row = torch.add(u % i, torch.div(group, d, rounding_mode="floor"), alpha=i)  # local % bs
    # The table with a row and a column of -1 after it: a request or local block outside the table
    # reads -1 there (index -1 wraps to the pad too), so every invalid reason ends as an entry
    # outside [0, blocks_per_peer).
    num_reqs, max_blocks = block_table.shape
    padded = torch.nn.functional.pad(block_table, (0, 1, 0, 1), value=-1)
    entry = padded[req_id.clamp(-1, num_reqs)[:, None], lb.clamp(-1, max_blocks)]
    kept = entry.clamp(0, p - 1)
    ok = kept == entry
    # (owner * p + entry) * bs + row from the kept entry: below d * p * bs, so int32 (checked).
    res = torch.where(ok, torch.add(row, kept, alpha=bs).add_(group % d, alpha=p * bs), -1)
    return _into(res, ok.sum(dim=1, dtype=torch.int32) if return_valid_counts else None, out, valid_counts_out)


def _wrap_int32(v: torch.Tensor) -> torch.Tensor:
    """int64 -> int32 with two's-complement wraparound (what the kernels' int32 arithmetic gives)."""
    return ((v + 2**31) % 2**32 - 2**31).to(torch.int32)


# ----------------------------------------------------------------- codec (§2)


def dequant_records_torch(records: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 656] records -> bf16 [n, 576] rows (SPEC §2, bit exact).

    f32(fp8 code) * f32 scale is one IEEE f32 multiply, then one RNE rounding
    to bf16; torch does neither fast-math nor a subnormal flush here.
    """
    rec = records.contiguous()
    n = rec.shape[0]
    codes = rec[:, :NOPE_DIM].view(torch.float8_e4m3fn).to(torch.float32)
    scales = rec[:, NOPE_DIM : NOPE_DIM + 16].contiguous().view(torch.float32)  # little-endian
    nope = (codes.view(n, _NUM_TILES, _TILE) * scales[:, :, None]).to(torch.bfloat16)
    rope = rec[:, NOPE_DIM + 16 :].contiguous().view(torch.int16).view(torch.bfloat16)
    return torch.cat([nope.view(n, NOPE_DIM), rope], dim=1)


def _pow2_ceil_torch(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= s, exactly, for float32 s >= 1e-4f (normal, never NaN).

    On the bits rather than ``exp2(ceil(log2(s)))``: log2 can round onto an integer for an s just
    above a power of two. A non-zero mantissa means s is not a power of two: the exponent field goes
    up by one and the mantissa is cleared (exponent 254 + 1 is inf, as float32 overflow is); inf
    keeps its bits."""
    bits = s.view(torch.int32)
    man = bits & 0x7FFFFF
    exp = bits & 0x7F800000
    up = exp + 0x00800000
    return torch.where((man == 0) | (exp == 0x7F800000), bits, up).view(torch.float32)


def tile_scales_torch(kv_c: torch.Tensor, *, revision: str = NEWEST) -> torch.Tensor:
    """float32 [n, 4]: the stored scale of each 128-element tile of kv_c [n, 512] under ``revision``."""
    check_revision(revision)
    n = kv_c.shape[0]
    x = kv_c.to(torch.float32).view(n, _NUM_TILES, _TILE)
    # fmaxf semantics: a NaN element never wins the max.
    amax = torch.where(torch.isnan(x), 0.0, x.abs()).amax(dim=2)
    # A true f32 division. Dividing by a Python scalar would not be one on
    # CUDA: torch turns `tensor / scalar` into a multiply by the reciprocal.
    q = amax / torch.full_like(amax, _FP8_MAX)
    rule = scale_of(revision)  # the revision's writer_scale rule: its floor, then maybe a power of two
    floor = torch.full_like(q, rule.floor_bits, dtype=torch.int32).view(torch.float32)
    s = torch.maximum(q, floor)
    return _pow2_ceil_torch(s) if rule.pow2 else s


def encode_records_torch(kv_c: torch.Tensor, k_pe: torch.Tensor, *, revision: str = NEWEST) -> torch.Tensor:
    """bf16/fp16 kv_c [n, 512], k_pe [n, 64] -> uint8 [n, 656] records (SPEC §2, §7 for ``revision``)."""
    return records_with_scales(kv_c, k_pe, scale=tile_scales_torch(kv_c, revision=revision))


def records_with_scales(kv_c: torch.Tensor, k_pe: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
    """The records of kv_c [n, 512], k_pe [n, 64] given each tile's float32 scale [n, 4]: codes
    satfinite e4m3fn(x / scale) (a true division), the scales stored as given, k_pe's raw bits."""
    n = kv_c.shape[0]
    x = kv_c.to(torch.float32).view(n, _NUM_TILES, _TILE)
    q = x / scale[:, :, None]
    # satfinite: finite overflow (and inf) saturates to +-448; clamp keeps NaN.
    q = torch.clamp(q, -_FP8_MAX, _FP8_MAX)
    codes = q.to(torch.float8_e4m3fn).view(torch.uint8)
    codes = torch.where(torch.isnan(q), _FP8_NAN_CODE, codes).to(torch.uint8)
    rec = torch.empty((n, RECORD_BYTES), dtype=torch.uint8, device=kv_c.device)
    rec[:, :NOPE_DIM] = codes.view(n, NOPE_DIM)
    rec[:, NOPE_DIM : NOPE_DIM + 16] = scale.contiguous().view(torch.uint8).view(n, 16)
    # Raw 16-bit patterns of k_pe, whatever its 16-bit dtype.
    rec[:, NOPE_DIM + 16 :] = k_pe.contiguous().view(torch.uint8).view(n, 2 * ROPE_DIM)
    return rec


# ---------------------------------------------------------------- gather (§4)


def gather_torch(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
    host_cache: torch.Tensor | None = None,
    host_row_ids: torch.Tensor | None = None,
    device_row_ids: torch.Tensor | None = None,
) -> None:
    """Gather request b's tokens seq_starts[b]... into dst[ws[b]:ws[b+1]], dequantized.

    With the host tier (SPEC 9.3: host_cache, host_row_ids, device_row_ids, all three or none), a
    position's slot s picks its record: device row device_row_ids[s] when >= 0, else host row
    host_row_ids[s]; the three are checked (``check_gather_host_args``, and the rows read,
    ``check_gather_host_rows``) before dst is written.

    SPEC §4: the last request runs to dst.shape[0]; a [B+1] cumulative
    workspace_starts has its last entry ignored; empty requests and total == 0
    are legal (batch_size == 0 too, when total == 0).

    Rejects, before writing anything (``GATHER_TORCH_REJECTS``): wrong dtypes,
    wrong shapes (dims, 656-byte records, 576 columns, fewer than batch_size
    entries in workspace_starts / block_table / seq_starts, batch_size < 0),
    tensors on different devices, ws[0] != 0 (and batch_size == 0 with
    total > 0: rows nobody owns), ws decreasing, ws[B-1] > total, and, for
    requests with rows only (an empty request reads nothing): a negative
    seq_start, a last position whose block index is >= block_table.shape[1],
    a block id read from the table outside [0, num_blocks). The value checks
    copy ws / seq_starts / the used table entries to the host (a sync on
    CUDA). Nothing is left unchecked that would let it read or write out of
    bounds.
    """
    check_gather_args(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    tiered = check_gather_host_args(src_cache, host_cache, host_row_ids, device_row_ids)
    num_blocks, bs, _ = src_cache.shape
    total, max_blocks = dst.shape[0], block_table.shape[1]
    b = batch_size
    device = dst.device
    ws_l = workspace_starts[:b].tolist()
    ss_l = [0] * b if seq_starts is None else seq_starts[:b].tolist()
    # Index checks first: the block ids can only be read from the table once
    # every block index is known to lie inside it.
    check_gather_values(ws=ws_l, seq_starts=ss_l, total=total, block_size=bs, max_blocks=max_blocks)
    if total == 0:
        return

    # Row j of dst belongs to request b(j) = (number of ws entries <= j) - 1.
    ws = torch.tensor(ws_l, dtype=torch.int64, device=device)
    ss = torch.tensor(ss_l, dtype=torch.int64, device=device)
    j = torch.arange(total, dtype=torch.int64, device=device)
    req = torch.searchsorted(ws, j, right=True) - 1  # ws[0] == 0, so req >= 0
    pos = ss[req] + (j - ws[req])
    blk_idx = torch.div(pos, bs, rounding_mode="floor")
    block_ids = block_table[req, blk_idx].long()
    check_block_ids(block_ids, num_blocks)
    entry = pos - blk_idx * bs
    cache = src_cache.view(torch.uint8)
    if not tiered:
        dst.copy_(dequant_records_torch(cache[block_ids, entry]))
        return
    assert host_cache is not None and host_row_ids is not None and device_row_ids is not None
    host = host_cache.view(torch.uint8)
    d, h = check_gather_host_rows(
        block_ids * bs + entry, host_row_ids, device_row_ids, host_rows=host.shape[0], device_rows=num_blocks * bs
    )
    on_device = d >= 0
    dev_rec = cache[torch.where(on_device, d, 0) // bs, torch.where(on_device, d, 0) % bs]
    host_idx = torch.where(on_device, -1, h)
    host_rec = torch.zeros_like(dev_rec)
    picked = host_idx >= 0
    if bool(picked.any()):
        # One host->device copy of the rows read (vLLM's kernel reads pinned memory in place).
        host_rec[picked] = host[host_idx[picked].cpu()].to(dev_rec.device)
    dst.copy_(dequant_records_torch(torch.where(on_device[:, None], dev_rec, host_rec)))


# ---------------------------------------------------------------- writer (§2)


def check_writer_call(
    kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str
) -> None:
    """Everything ``writer_torch`` refuses (``WRITER_TORCH_REJECTS``), before anything is written:
    the host checks, then a slot past the cache (a host read of slot_mapping)."""
    check_writer_args(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)
    num_blocks, bs, _ = kv_cache.shape
    if slot_mapping.shape[0] and bool((slot_mapping >= 0).any()):
        hi = int(slot_mapping.max())
        if hi >= num_blocks * bs:
            raise InvalidInputError(
                "slot_past_cache", f"slot_mapping max={hi} >= num_blocks*block_size={num_blocks * bs}"
            )


def writer_torch(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "fp8_ds_mla",
    scale: torch.Tensor | None = None,
    skip_scale: bool = False,
    *,
    revision: str = NEWEST,
) -> None:
    """vLLM's concat_and_cache_mla for kv_cache_dtype="fp8_ds_mla", in place.

    Token i (i < len(slot_mapping)) with slot s >= 0 writes one 656-byte
    record at block s // bs, offset s % bs; a negative slot writes nothing
    (vLLM skips any slot < 0). ``scale`` is ignored for this dtype (per-tile
    scales are computed), and so is ``skip_scale`` (vLLM 0.33.0: it only skips the
    division by ``scale``, which this dtype never makes). Rejects ``WRITER_TORCH_REJECTS`` before writing,
    including a slot >= num_blocks * bs (a host read of slot_mapping).
    A slot named by several tokens gets the last one's record, on every
    device (a GPU kernel races there; we pick the oracle's reading).
    ``revision`` (keyword only, beyond vLLM's signature): the contract revision whose tile scale
    rule to follow (SPEC §7; the newest by default); an unknown one is a ValueError.
    """
    del scale, skip_scale  # the fp8_ds_mla path computes its own per-tile scales
    check_revision(revision)
    check_writer_call(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)
    num_blocks, bs, _ = kv_cache.shape
    t = slot_mapping.shape[0]
    if t == 0:
        return
    slots = slot_mapping.long()
    keep = slots >= 0
    idx = torch.nonzero(keep).flatten()
    if idx.numel() == 0:
        return
    # Keep the last token per slot: a stable sort keeps token order inside a
    # run of equal slots, and the run's last entry is the one to write.
    s_sorted, perm = torch.sort(slots[idx], stable=True)
    last = torch.ones_like(s_sorted, dtype=torch.bool)
    last[:-1] = s_sorted[1:] != s_sorted[:-1]
    idx = idx[perm[last]]
    rec = encode_records_torch(kv_c[idx], k_pe[idx], revision=revision)
    s = slots[idx]
    cache = kv_cache.view(torch.uint8)
    cache[torch.div(s, bs, rounding_mode="floor"), s % bs] = rec
