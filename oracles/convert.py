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
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["convert_loop", "convert", "convert_undefined_rows", "wrap_int32"]

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
) -> None:
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    if token_indices.dim() != 2:
        raise ValueError(f"token_indices.shape={tuple(token_indices.shape)}: expected [N, K]")
    if block_table.dim() != 2:
        raise ValueError(f"block_table.shape={tuple(block_table.shape)}: expected [R, M]")
    n = token_indices.shape[0]
    if req_id.dim() != 1 or req_id.shape[0] != n:
        raise ValueError(
            f"req_id.shape={tuple(req_id.shape)}: expected [{n}] (token_indices rows)"
        )
    if has_prefill_workspace:
        if prefill_workspace_request_ids is None or prefill_workspace_starts is None:
            raise ValueError(
                "has_prefill_workspace=True needs prefill_workspace_request_ids "
                "and prefill_workspace_starts"
            )
        if prefill_workspace_request_ids.reshape(-1).shape[0] < n:
            raise ValueError(
                "prefill_workspace_request_ids has "
                f"{prefill_workspace_request_ids.numel()} entries < N={n}"
            )


def convert_loop(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    has_prefill_workspace: bool = False,
    prefill_workspace_request_ids: Tensor | None = None,
    prefill_workspace_starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """SPEC section 3, cell by cell in Python ints. Returns (out int32 [N, K],
    valid_counts int32 [N]) on the CPU. See the module docstring for the
    int32 wraparound and undefined-row readings."""
    _check(
        req_id=req_id, block_table=block_table, token_indices=token_indices,
        block_size=block_size, has_prefill_workspace=has_prefill_workspace,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
    )
    table = block_table.tolist()
    n_req, n_blk = block_table.shape
    toks = token_indices.tolist()
    reqs = req_id.tolist()
    pw_ids = (
        prefill_workspace_request_ids.reshape(-1).tolist() if has_prefill_workspace else None
    )
    pw_starts = prefill_workspace_starts.reshape(-1).tolist() if has_prefill_workspace else None
    out: list[list[int]] = []
    counts: list[int] = []
    for i, row in enumerate(toks):
        is_prefill = pw_ids is not None and pw_ids[i] >= 0
        if is_prefill:
            defined = pw_ids[i] < len(pw_starts)
        else:
            defined = 0 <= reqs[i] < n_req
        out_row: list[int] = []
        valid = 0
        for tok in row:
            if not defined or tok < 0:
                out_row.append(-1)
                continue
            blk, off = tok // block_size, tok % block_size
            if not 0 <= blk < n_blk:
                out_row.append(-1)
                continue
            if is_prefill:
                value = pw_starts[pw_ids[i]] + tok
            else:
                value = table[reqs[i]][blk] * block_size + off
            out_row.append(wrap_int32(value))
            valid += 1
        out.append(out_row)
        counts.append(valid)
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
) -> Tensor:
    """bool [N]: rows whose result SPEC leaves undefined (the kernel would
    read outside block_table or prefill_workspace_starts). On req_id's
    device."""
    n_req = block_table.shape[0]
    req = req_id.reshape(-1).to(torch.int64)
    bad_req = (req < 0) | (req >= n_req)
    if not has_prefill_workspace:
        return bad_req
    assert prefill_workspace_request_ids is not None and prefill_workspace_starts is not None
    pw = prefill_workspace_request_ids.reshape(-1)[: req.shape[0]].to(req.device, torch.int64)
    is_prefill = pw >= 0
    bad_pw = pw >= prefill_workspace_starts.numel()
    return torch.where(is_prefill, bad_pw, bad_req)


def convert(
    *,
    req_id: Tensor,
    block_table: Tensor,
    token_indices: Tensor,
    block_size: int,
    has_prefill_workspace: bool = False,
    prefill_workspace_request_ids: Tensor | None = None,
    prefill_workspace_starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Vectorized SPEC section 3 on token_indices' device; bit-identical to
    `convert_loop`. Indices are clamped before gathering only so that the
    gather itself stays in bounds; the clamped values are always masked."""
    _check(
        req_id=req_id, block_table=block_table, token_indices=token_indices,
        block_size=block_size, has_prefill_workspace=has_prefill_workspace,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
    )
    dev = token_indices.device
    n, k = token_indices.shape
    n_req, n_blk = block_table.shape
    tok = token_indices.to(torch.int64)
    req = req_id.to(dev, torch.int64)
    table = block_table.to(dev, torch.int64)

    blk = torch.div(tok, block_size, rounding_mode="floor")
    off = tok - blk * block_size
    invalid = (tok < 0) | (blk < 0) | (blk >= n_blk)
    undefined = convert_undefined_rows(
        req_id=req, block_table=block_table, has_prefill_workspace=has_prefill_workspace,
        prefill_workspace_request_ids=prefill_workspace_request_ids,
        prefill_workspace_starts=prefill_workspace_starts,
    )

    if n_req > 0 and n_blk > 0:
        rows = req.clamp(0, n_req - 1).unsqueeze(1).expand(n, k)
        base = table[rows, blk.clamp(0, n_blk - 1)]
    else:
        base = torch.zeros_like(tok)
    value = base * block_size + off

    if has_prefill_workspace:
        assert prefill_workspace_request_ids is not None and prefill_workspace_starts is not None
        pw = prefill_workspace_request_ids.reshape(-1)[:n].to(dev, torch.int64)
        starts = prefill_workspace_starts.reshape(-1).to(dev, torch.int64)
        if starts.numel() > 0:
            ws = starts[pw.clamp(0, starts.numel() - 1)]
        else:
            ws = torch.zeros_like(pw)
        value = torch.where((pw >= 0).unsqueeze(1), ws.unsqueeze(1) + tok, value)

    invalid = invalid | undefined.unsqueeze(1)
    out = torch.where(invalid, torch.full_like(value, -1), _wrap_int32_tensor(value))
    counts = (~invalid).sum(dim=1)
    return out.to(torch.int32), counts.to(torch.int32)
