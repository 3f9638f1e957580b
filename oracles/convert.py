"""Oracle for `convert`: request-local top-k -> global cache slots (SPEC.md section 3).

For row i, column c, with tok = token_indices[i, c] and req = req_id[i]:
invalid if tok < 0, or if blk = tok // bs is not in [0, M) (prefill rows
too: the block check comes before the prefill branch, as in vLLM's kernel);
otherwise a prefill row (has_prefill_workspace and
prefill_workspace_request_ids[i] >= 0) gives
prefill_workspace_starts[prefill_workspace_request_ids[i]] + tok, any other
row block_table[req, blk] * bs + tok % bs. out = -1 where invalid;
valid_counts[i] = number of valid columns.

Readings chosen where SPEC is silent:

- int32 arithmetic: the Triton kernel computes `base * BLOCK_SIZE + off` and
  `workspace_start + tok` in int32, so the oracle computes in int64 and wraps
  the value to int32 (two's complement) -- a kernel that wraps is not
  falsely flagged. Validity is decided on the inputs, never on the value: a
  valid column whose value happens to be negative (even -1) still counts.
- Undefined rows: a non-prefill row whose req is outside [0, R), or a prefill
  row whose prefill_workspace_request_ids[i] is past
  prefill_workspace_starts, makes the kernel read outside its inputs; SPEC
  calls these input classes, not kernel bugs. The oracle does not crash: it
  returns out = -1 on the whole row and valid_counts = 0, and
  `convert_undefined_rows` says which rows those are so the harness can
  report them instead of comparing them. Prefill rows never read the block
  table, so their req does not matter.
- BLOCK_N / NUM_TOPK_TOKENS are launch parameters with no effect on the
  result; the oracle does not take them (the harness checks the rejection
  preconditions itself).

Later options (SPEC section 7), keyword-only, off by default:

- ``block_stride_rows`` (vLLM's BLOCK_STRIDE_ROWS, None = block_size): a
  cache slot is block_table[req, blk] * block_stride_rows + off, with blk and
  off still tok // block_size and tok % block_size and the bounds rules
  unchanged; the product wraps to int32 as before. Prefill rows are offsets
  into the dense workspace and do not use it. Any stride >= 1 is computed
  (vLLM's layouts have stride >= block_size, but the formula needs no more).
- ``compact_to_front`` (vLLM's COMPACT_TO_FRONT): a row's valid values are
  packed at its front and the rest is -1. vLLM leaves the order inside the
  prefix unspecified (tiles race on an atomic slot allocator); the oracle
  returns one canonical order, column order, and valid_counts exactly. The
  harness must compare compacted rows as multisets: `rows_as_sets_equal`.
  Validity is still decided on the inputs, so a valid value that wrapped to
  -1 sits in the prefix and counts.

What vLLM's releases added to the plain convert (SPEC 10; read from the 0.30.0, 0.33.0 and 0.34.0
wheels), keyword-only, each a no-op at its default:

- ``idx_mapping`` (0.33.0; int32 [num_requests]): a decode row reads table row
  ``max(idx_mapping[req], 0)`` instead of ``req``; a negative entry reads row 0, not nothing.
  The host checks only its dtype and contiguity, so a req outside the mapping, or a mapped row
  outside the table, is an undefined row as above. Prefill rows never read the table.
- the DCP arguments (0.30.0): ``dcp_size`` D (default 1), ``dcp_rank`` (0),
  ``dcp_interleave`` I (vLLM's ``cp_kv_cache_interleave_size``, 1) and
  ``prefill_rank_stride`` (vLLM's ``prefill_workspace_rank_stride``; its None launches as 0).
  A token t >= 0 belongs to rank ``owner = (t // I) % D`` at ``local = (t // (D*I)) * I + t % I``,
  and every bound and offset is taken on ``local``: blk = local // bs, off = local % bs, and
  0 <= blk < M must hold on every row. A decode token another rank owns is invalid. A prefill
  token is valid whichever rank owns it, at ``owner * prefill_rank_stride +
  prefill_workspace_starts[p] + local`` (the workspace is the rank-major all-gather of every
  rank's shard). With D = 1 every token is rank 0's and local, so this is the rule above.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["convert_loop", "convert", "convert_undefined_rows", "rows_as_sets_equal", "wrap_int32"]

_INT32_SPAN = 1 << 32
_INT32_HALF = 1 << 31


def wrap_int32(v: int) -> int:
    """Two's-complement wraparound of a Python int to int32."""
    return (v + _INT32_HALF) % _INT32_SPAN - _INT32_HALF


def _wrap_int32_tensor(v: Tensor) -> Tensor:
    return ((v + _INT32_HALF) & (_INT32_SPAN - 1)) - _INT32_HALF


def _check(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    has_prefill_workspace: bool,
    prefill_workspace_request_ids: Tensor | None,
    prefill_workspace_starts: Tensor | None,
    block_stride_rows: int | None,
    idx_mapping: Tensor | None = None,
    dcp: tuple[int, int, int] = (1, 0, 1),
) -> int:
    """Check the call; return the effective block stride in rows."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    size, rank, interleave = dcp
    if size < 1 or not 0 <= rank < size or interleave < 1:
        raise ValueError(f"dcp_size={size}, dcp_rank={rank}, dcp_interleave={interleave}: need 0 <= rank < size, >= 1")
    if idx_mapping is not None and idx_mapping.dim() != 1:
        raise ValueError(f"idx_mapping.shape={tuple(idx_mapping.shape)}: expected [num_requests]")
    stride = block_size if block_stride_rows is None else block_stride_rows
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"block_stride_rows={block_stride_rows!r}: must be None or an int >= 1")
    if token_indices.dim() != 2:
        raise ValueError(f"token_indices.shape={tuple(token_indices.shape)}: expected [N, K]")
    if block_table.dim() != 2:
        raise ValueError(f"block_table.shape={tuple(block_table.shape)}: expected [R, M]")
    n = token_indices.shape[0]
    if req_id.dim() != 1 or req_id.shape[0] != n:
        raise ValueError(f"req_id.shape={tuple(req_id.shape)}: expected [{n}] (token_indices rows)")
    if has_prefill_workspace:
        if prefill_workspace_request_ids is None or prefill_workspace_starts is None:
            raise ValueError(
                "has_prefill_workspace=True needs prefill_workspace_request_ids and prefill_workspace_starts"
            )
        if prefill_workspace_request_ids.reshape(-1).shape[0] < n:
            raise ValueError(
                f"prefill_workspace_request_ids has {prefill_workspace_request_ids.numel()} entries < N={n}"
            )
    return stride


def convert_loop(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    has_prefill_workspace: bool = False,
    prefill_workspace_request_ids: Tensor | None = None,
    prefill_workspace_starts: Tensor | None = None,
    block_stride_rows: int | None = None,
    compact_to_front: bool = False,
    idx_mapping: Tensor | None = None,
    dcp_size: int = 1,
    dcp_rank: int = 0,
    dcp_interleave: int = 1,
    prefill_rank_stride: int = 0,
) -> tuple[Tensor, Tensor]:
    """SPEC section 3, cell by cell in Python ints. Returns (out int32 [N, K],
    valid_counts int32 [N]) on the CPU. See the module docstring for the
    int32 wraparound and undefined-row readings, the options and the releases' arguments."""
    stride = _check(
        req_id=req_id,
        block_table=block_table,
        token_indices=token_indices,
        block_size=block_size,
        has_prefill_workspace=has_prefill_workspace,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
        block_stride_rows=block_stride_rows,
        idx_mapping=idx_mapping,
        dcp=(dcp_size, dcp_rank, dcp_interleave),
    )
    mapping = idx_mapping.tolist() if idx_mapping is not None else None
    d, inter = dcp_size, dcp_interleave
    table = block_table.tolist()
    n_req, n_blk = block_table.shape
    toks = token_indices.tolist()
    reqs = req_id.tolist()
    pw_ids = prefill_workspace_request_ids.reshape(-1).tolist() if has_prefill_workspace else None
    pw_starts = prefill_workspace_starts.reshape(-1).tolist() if has_prefill_workspace else None
    out: list[list[int]] = []
    counts: list[int] = []
    for i, row in enumerate(toks):
        is_prefill = pw_ids is not None and pw_ids[i] >= 0
        req = reqs[i]
        if mapping is not None:  # the table row is the mapping's, a negative entry row 0
            req = max(mapping[req], 0) if 0 <= req < len(mapping) else -1
        if is_prefill:
            defined = pw_ids[i] < len(pw_starts)
        else:
            defined = 0 <= req < n_req
        out_row: list[int] = []
        kept: list[int] = []  # the valid values, in column order
        for tok in row:
            if not defined or tok < 0:
                out_row.append(-1)
                continue
            owner, local = (tok // inter) % d, (tok // (d * inter)) * inter + tok % inter
            blk, off = local // block_size, local % block_size
            if not 0 <= blk < n_blk or (owner != dcp_rank and not is_prefill):
                out_row.append(-1)
                continue
            if is_prefill:
                value = owner * prefill_rank_stride + pw_starts[pw_ids[i]] + local
            else:
                value = table[req][blk] * stride + off
            out_row.append(wrap_int32(value))
            kept.append(wrap_int32(value))
        if compact_to_front:
            out_row = kept + [-1] * (len(row) - len(kept))
        out.append(out_row)
        counts.append(len(kept))
    n, k = token_indices.shape
    return (
        torch.tensor(out, dtype=torch.int32).reshape(n, k),
        torch.tensor(counts, dtype=torch.int32).reshape(n),
    )


def convert_undefined_rows(
    *,
    req_id: Tensor,
    block_table: Tensor,
    has_prefill_workspace: bool = False,
    prefill_workspace_request_ids: Tensor | None = None,
    prefill_workspace_starts: Tensor | None = None,
    idx_mapping: Tensor | None = None,
) -> Tensor:
    """bool [N]: rows whose result SPEC leaves undefined (the kernel would
    read outside block_table, idx_mapping or prefill_workspace_starts). On req_id's
    device."""
    n_req = block_table.shape[0]
    req = _table_rows(req_id.reshape(-1).to(torch.int64), idx_mapping)
    bad_req = (req < 0) | (req >= n_req)
    if not has_prefill_workspace:
        return bad_req
    assert prefill_workspace_request_ids is not None and prefill_workspace_starts is not None
    pw = prefill_workspace_request_ids.reshape(-1)[: req.shape[0]].to(req.device, torch.int64)
    is_prefill = pw >= 0
    bad_pw = pw >= prefill_workspace_starts.numel()
    return torch.where(is_prefill, bad_pw, bad_req)


def _table_rows(req: Tensor, idx_mapping: Tensor | None) -> Tensor:
    """Each row's block-table row: ``req``, or through ``idx_mapping`` ``max(idx_mapping[req], 0)``
    (-1, undefined, where req is outside the mapping)."""
    if idx_mapping is None:
        return req
    m = idx_mapping.reshape(-1).to(req.device, torch.int64)
    inside = (req >= 0) & (req < m.numel())
    mapped = m[req.clamp(0, max(m.numel() - 1, 0))].clamp(min=0) if m.numel() else torch.zeros_like(req)
    return torch.where(inside, mapped, torch.full_like(req, -1))


def convert(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    has_prefill_workspace: bool = False,
    prefill_workspace_request_ids: Tensor | None = None,
    prefill_workspace_starts: Tensor | None = None,
    block_stride_rows: int | None = None,
    compact_to_front: bool = False,
    idx_mapping: Tensor | None = None,
    dcp_size: int = 1,
    dcp_rank: int = 0,
    dcp_interleave: int = 1,
    prefill_rank_stride: int = 0,
) -> tuple[Tensor, Tensor]:
    """Vectorized SPEC section 3 on token_indices' device; bit-identical to
    `convert_loop`. Indices are clamped before gathering only so that the
    gather itself stays in bounds; the clamped values are always masked."""
    stride = _check(
        req_id=req_id,
        block_table=block_table,
        token_indices=token_indices,
        block_size=block_size,
        has_prefill_workspace=has_prefill_workspace,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
        block_stride_rows=block_stride_rows,
        idx_mapping=idx_mapping,
        dcp=(dcp_size, dcp_rank, dcp_interleave),
    )
    dev = token_indices.device
    n, k = token_indices.shape
    n_req, n_blk = block_table.shape
    tok = token_indices.to(torch.int64)
    req = _table_rows(req_id.to(dev, torch.int64), idx_mapping)
    table = block_table.to(dev, torch.int64)

    # DCP: each token's owner and its index in that rank's share (t itself with D = 1).
    t = tok.clamp(min=0)
    group = torch.div(t, dcp_interleave, rounding_mode="floor")
    owner = group % dcp_size
    local = torch.div(group, dcp_size, rounding_mode="floor") * dcp_interleave + t % dcp_interleave
    blk = torch.div(local, block_size, rounding_mode="floor")
    off = local - blk * block_size
    invalid = (tok < 0) | (blk < 0) | (blk >= n_blk)
    undefined = convert_undefined_rows(
        req_id=req_id.to(dev, torch.int64),
        block_table=block_table,
        has_prefill_workspace=has_prefill_workspace,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
        idx_mapping=idx_mapping,
    )
    remote = owner != dcp_rank  # invalid on a decode row only

    if n_req > 0 and n_blk > 0:
        rows = req.clamp(0, n_req - 1).unsqueeze(1).expand(n, k)
        base = table[rows, blk.clamp(0, n_blk - 1)]
    else:
        base = torch.zeros_like(tok)
    value = base * stride + off

    if has_prefill_workspace:
        assert prefill_workspace_request_ids is not None and prefill_workspace_starts is not None
        pw = prefill_workspace_request_ids.reshape(-1)[:n].to(dev, torch.int64)
        starts = prefill_workspace_starts.reshape(-1).to(dev, torch.int64)
        if starts.numel() > 0:
            ws = starts[pw.clamp(0, starts.numel() - 1)]
        else:
            ws = torch.zeros_like(pw)
        prefill_value = owner * prefill_rank_stride + ws.unsqueeze(1) + local
        value = torch.where((pw >= 0).unsqueeze(1), prefill_value, value)
        remote = remote & (pw < 0).unsqueeze(1)

    invalid = invalid | remote | undefined.unsqueeze(1)
    out = torch.where(invalid, torch.full_like(value, -1), _wrap_int32_tensor(value))
    counts = (~invalid).sum(dim=1)
    if compact_to_front:
        out = _compact(out, ~invalid)
    return out.to(torch.int32), counts.to(torch.int32)


def _compact(out: Tensor, valid: Tensor) -> Tensor:
    """Pack each row's valid entries to its front in column order, -1 after.

    A valid entry's destination is its rank among the row's valid entries
    (inclusive prefix sum - 1); the others are parked on a scratch column
    that is cut off, so one scatter with distinct targets does it.
    """
    n, k = out.shape
    dest = torch.where(valid, valid.to(torch.int64).cumsum(dim=1) - 1, torch.full_like(out, k))
    packed = torch.full((n, k + 1), -1, dtype=out.dtype, device=out.device)
    packed.scatter_(1, dest, torch.where(valid, out, torch.full_like(out, -1)))
    return packed[:, :k]


def rows_as_sets_equal(*, expected: Tensor, actual: Tensor, counts: Tensor) -> Tensor:
    """bool [N]: row i of `actual` holds the same multiset of values as the
    first counts[i] entries of `expected` in its first counts[i] columns, and
    -1 in every later column. How the harness compares compact-to-front
    output (SPEC section 7): the order inside the prefix is unspecified, the
    prefix length and the -1 tail are not. A multiset, not a set: top-k rows
    may repeat a token, and then the slot must appear as often.

    `expected` is the oracle's compacted [N, K], `counts` the oracle's
    valid_counts (values in [0, K]); any integer dtypes, any one device
    (counts and actual are moved to expected's device). Vectorized: both
    prefixes are sorted with a sentinel above every int32 in the tail.
    """
    if expected.dim() != 2 or tuple(actual.shape) != tuple(expected.shape):
        raise ValueError(
            f"actual.shape={tuple(actual.shape)} vs expected.shape={tuple(expected.shape)}: "
            "expected two equal [N, K] shapes"
        )
    n, k = expected.shape
    if counts.reshape(-1).shape[0] != n:
        raise ValueError(f"counts.shape={tuple(counts.shape)}: expected [{n}]")
    dev = expected.device
    exp = expected.to(torch.int64)
    act = actual.to(dev, torch.int64)
    front = torch.arange(k, device=dev).unsqueeze(0) < counts.reshape(-1, 1).to(dev, torch.int64)
    sentinel = torch.full_like(exp, 1 << 40)
    same_front = (
        torch.where(front, exp, sentinel).sort(dim=1).values == torch.where(front, act, sentinel).sort(dim=1).values
    ).all(dim=1)
    tail_is_pad = torch.where(front, torch.full_like(act, -1), act).eq(-1).all(dim=1)
    return same_front & tail_is_pad
