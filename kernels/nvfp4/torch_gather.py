"""Our torch nvfp4_ds_mla gather (SPEC.md sections 4 and 11.2), with vLLM 0.34.0's signature:
``cp_gather_and_upconvert_nvfp4_kv_cache(src_cache, dst, block_table, workspace_starts,
batch_size, seq_starts=None)``.

Written from the layout (the format table, which kernels may read) and the reader's formula, not
from the oracles (the no-borrowing contract): each NoPE value is ``e2m1(code) * e4m3(scale of its
16-value block)`` in f32, exact for every scale byte a writer emits, then one cast to bf16; RoPE
values are their e4m3 bytes widened. The addressing and the host checks are the fp8 gather's
(kernels/checks.py), with a 352-byte record.
"""

from __future__ import annotations

import torch

from mlafuzz.kernels.checks import check_block_ids, check_gather_args, check_gather_values
from mlafuzz.oracles.formats.table import get

__all__ = ["FORMAT", "E2M1_VALUES", "gather_nvfp4_torch", "record_slots", "upconvert"]

FORMAT = get("nvfp4_ds_mla")
# e2m1 code c: sign c >> 3, magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6}[c & 7] (SPEC 11.1; code 8 is -0).
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = _MAGNITUDES + tuple(-m for m in _MAGNITUDES)


def record_slots(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None,
) -> torch.Tensor:
    """The checked call's source slot of each dst row (``block * bs + entry``), int64 [total].

    Rejects before writing anything what the fp8 gather rejects (``GATHER_TORCH_REJECTS``, its
    host tier aside): dtypes, shapes (352-byte records, 576 columns), devices, the ws order, ws
    past dst, a negative seq_start, a block index past the table, a block id past the cache."""
    check_gather_args(
        src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, record_bytes=FORMAT.record_bytes
    )
    num_blocks, bs, _ = src_cache.shape
    total, b, device = dst.shape[0], batch_size, dst.device
    ws_l = workspace_starts[:b].tolist()
    ss_l = [0] * b if seq_starts is None else seq_starts[:b].tolist()
    check_gather_values(ws=ws_l, seq_starts=ss_l, total=total, block_size=bs, max_blocks=block_table.shape[1])
    if total == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    ws = torch.tensor(ws_l, dtype=torch.int64, device=device)
    ss = torch.tensor(ss_l, dtype=torch.int64, device=device)
    j = torch.arange(total, dtype=torch.int64, device=device)
    req = torch.searchsorted(ws, j, right=True) - 1  # row j's request: ws[0] == 0, so req >= 0
    pos = ss[req] + (j - ws[req])
    blk = torch.div(pos, bs, rounding_mode="floor")
    block_ids = block_table[req, blk].long()
    check_block_ids(block_ids, num_blocks)
    return block_ids * bs + (pos - blk * bs)


def _e4m3(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float8_e4m3fn).to(torch.float32)


def upconvert(records: torch.Tensor) -> torch.Tensor:
    """Records uint8 [n, 352] -> bf16 [n, 576]."""
    nope, scale, rope = (FORMAT.plane(p) for p in ("nope", "scale", "rope"))
    packed = records[:, nope.offset : nope.stop].to(torch.int64)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(-1, nope.elements)  # low nibble: even
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=records.device)
    slots = torch.tensor(FORMAT.scale_slots, dtype=torch.int64, device=records.device)
    scales = _e4m3(records[:, scale.offset : scale.stop][:, slots])  # block s's scale, block order
    values = table[codes] * scales.repeat_interleave(FORMAT.scale_block, dim=-1)
    return torch.cat([values, _e4m3(records[:, rope.offset : rope.stop])], dim=-1).to(torch.bfloat16)


def gather_nvfp4_torch(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    workspace_starts: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    """dst[ws[b] + j] = the upconverted record at position seq_starts[b] + j of request b (the last
    request runs to dst.shape[0]; a [B+1] workspace_starts has its last entry ignored)."""
    slots = record_slots(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    if slots.numel():
        flat = src_cache.view(torch.uint8).reshape(-1, FORMAT.record_bytes)
        dst.copy_(upconvert(flat[slots]))
