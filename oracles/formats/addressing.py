"""Where a gathered row's record is: SPEC.md section 4's addressing, which names no record format.

Request b owns dst rows [ws[b], ws[b+1]); its row ws[b] + j reads position seq_starts[b] + j,
which lives at slot block_table[b, p // bs] * bs + p % bs. Every format's gather oracle (fp8_ds_mla's
``oracles.gather``, nvfp4_ds_mla's ``formats.nvfp4_gather``, a new format's) finds its records
here and judges a call's addressing with the same precondition classes; what a record holds is the
format's (its row in ``table``, its codec). Beside the table, not in ``oracles.gather``, so that the
formats room needs nothing of fp8_ds_mla's oracle.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Callable

import torch
from torch import Tensor

__all__ = ["PRECONDITION_CLASSES", "GatherCall", "addressing_violations", "row_records", "violations"]

PRECONDITION_CLASSES = (
    "ws0_nonzero",
    "ws_decreasing",
    "ws_past_total",
    "block_index_past_table",
    "block_id_past_cache",
    "negative_seq_start",
    "slot_past_row_map",
    "device_row_past_cache",
    "host_row_past_cache",
)


def violations(ws: list[int], ss: list[int], table: list[list[int]], bs: int, num_blocks: int, total: int) -> list[str]:
    found: set[str] = set()
    n = len(ws)
    if n == 0:
        return ["ws0_nonzero"] if total > 0 else []
    if ws[0] != 0:
        found.add("ws0_nonzero")
    if any(ws[b + 1] < ws[b] for b in range(n - 1)):
        found.add("ws_decreasing")
    if ws[n - 1] > total:
        found.add("ws_past_total")
    ends = ws[1:] + [total]
    m = len(table[0]) if table else 0
    for b in range(n):
        length = ends[b] - ws[b]
        if length <= 0:
            continue
        if ss[b] < 0:
            found.add("negative_seq_start")
        first, last = ss[b], ss[b] + length - 1
        if last // bs >= m:
            found.add("block_index_past_table")
        lo = max(0, first) // bs
        hi = min(last // bs, m - 1)
        if any(not 0 <= table[b][i] < num_blocks for i in range(lo, hi + 1)):
            found.add("block_id_past_cache")
    return [c for c in PRECONDITION_CLASSES if c in found]


def addressing_violations(
    *, ws: list[int], seq_starts: list[int], table: list[list[int]], block_size: int, num_blocks: int, total: int
) -> list[str]:
    """The violated classes of section 4's addressing (the first six of the vocabulary) for
    ws[:B], seq_starts[:B] and the table's first B rows as lists: they name no record format, so
    every format's gather (``oracles.gather``, ``oracles.formats.nvfp4_gather``) judges its calls
    with them."""
    return violations(ws, seq_starts, table, block_size, num_blocks, total)


def row_records(
    *,
    block_size: int,
    block_table: Tensor,
    workspace_starts: Tensor,
    batch_size: int,
    seq_starts: Tensor | None,
    total: int,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """(block id, entry in the block), int64 [total] each, of the record every dst row reads,
    vectorized: the owner of row i is found with a right-sided searchsorted over ws[:B] (with
    empty requests, the last request whose start is <= i), its position is
    seq_starts[owner] + i - ws[owner], then the block table. Assumes the preconditions hold
    (``gather`` checks them first; the fused GPU check runs on valid cases only)."""
    ws = workspace_starts.reshape(-1)[:batch_size].to(device, torch.int64)
    rows = torch.arange(total, dtype=torch.int64, device=device)
    owner = torch.searchsorted(ws, rows, right=True) - 1
    pos = rows - ws[owner]
    if seq_starts is not None:
        pos += seq_starts.reshape(-1)[:batch_size].to(device, torch.int64)[owner]
    blk_idx = torch.div(pos, block_size, rounding_mode="floor")
    block = block_table[:batch_size].to(device, torch.int64)[owner, blk_idx]
    return block, pos - blk_idx * block_size


# The arguments of ``row_records`` that a call holds as its caller passed them.
_ROW_ARGS = ("block_table", "workspace_starts", "batch_size", "seq_starts", "total")


@dataclass(frozen=True, eq=False)  # eq=False: tensors compare elementwise, so a call is itself
class GatherCall:
    """One gather call (SPEC 4) as every format's gather oracle takes it, its shapes checked on the
    host: ValueError for malformed arguments (a record size not the format's, B or total < 0, ws,
    seq_starts or block_table shorter than B; the last entry of a [B+1] ws is ignored). Its six
    arguments are positional, in the order of every gather's signature (SPEC 4's, vLLM's), so that
    an oracle hands its keyword-only arguments on in one line; the format's ``as_records`` views
    ``src_cache`` as uint8 records ``[num_blocks, bs, record_bytes]`` (``cache``). ``ws``,
    ``starts`` and ``table`` are ws[:B], seq_starts[:B] (zeros for None) and the table's first B
    rows as host lists, for the preconditions and the loop versions."""

    src_cache: Tensor
    block_table: Tensor
    workspace_starts: Tensor
    batch_size: int
    seq_starts: Tensor | None
    total: int
    _: KW_ONLY
    as_records: Callable[[Tensor], Tensor]
    record_bytes: int
    cache: Tensor = field(init=False, repr=False)
    ws: list[int] = field(init=False)
    starts: list[int] = field(init=False)
    table: list[list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cache = self.as_records(self.src_cache)
        if cache.dim() != 3 or cache.shape[2] != self.record_bytes:
            raise ValueError(f"src_cache.shape={tuple(cache.shape)}: expected [num_blocks, bs, {self.record_bytes}]")
        b = self.batch_size
        if b < 0 or self.total < 0:
            raise ValueError(f"batch_size={b}, total={self.total}: must be >= 0")
        ws = self.workspace_starts.reshape(-1).tolist()
        if len(ws) < b:
            raise ValueError(f"workspace_starts has {len(ws)} entries < batch_size={b}")
        starts = [0] * b if self.seq_starts is None else self.seq_starts.reshape(-1).tolist()
        if len(starts) < b:
            raise ValueError(f"seq_starts has {len(starts)} entries < batch_size={b}")
        if self.block_table.dim() != 2 or (b > 0 and self.block_table.shape[0] < b):
            raise ValueError(f"block_table.shape={tuple(self.block_table.shape)}: expected [>= {b}, M]")
        # Derived once, at construction: the call is frozen.
        object.__setattr__(self, "cache", cache)
        object.__setattr__(self, "ws", ws[:b])
        object.__setattr__(self, "starts", starts[:b])
        object.__setattr__(self, "table", self.block_table[:b].tolist())

    @property
    def block_size(self) -> int:
        return self.cache.shape[1]

    @property
    def num_blocks(self) -> int:
        return self.cache.shape[0]

    def violations(self) -> list[str]:
        """The violated addressing classes (``addressing_violations``); [] when well defined."""
        return violations(self.ws, self.starts, self.table, self.block_size, self.num_blocks, self.total)

    def require(self, bad: list[str] | None = None) -> GatherCall:
        """This call when it is well defined; ValueError naming the violated classes otherwise: ``bad``
        (the addressing's and any its format adds), by default ``violations()``."""
        bad = self.violations() if bad is None else bad
        if bad:
            raise ValueError(
                f"gather preconditions violated: {bad} (batch_size={self.batch_size}, "
                f"total={self.total}, workspace_starts={self.ws}, seq_starts={self.starts})"
            )
        return self

    def row_records(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """``row_records`` of this call: (block id, entry), int64 [total] each, on ``device``."""
        return row_records(block_size=self.block_size, device=device, **{k: getattr(self, k) for k in _ROW_ARGS})

    def records(self) -> Tensor:
        """The record each dst row reads, uint8 [total, record_bytes] on the cache's device."""
        if self.total == 0:
            return self.cache.new_empty(0, self.record_bytes)
        block, entry = self.row_records(self.cache.device)
        return self.cache[block, entry]

    def slots_loop(self) -> list[tuple[int, int]]:
        """``row_records`` request by request and row by row: (block id, entry) of each dst row."""
        rows: list[tuple[int, int] | None] = [None] * self.total
        bs = self.block_size
        for b in range(self.batch_size):
            end = self.ws[b + 1] if b + 1 < self.batch_size else self.total
            for j in range(end - self.ws[b]):
                p = self.starts[b] + j
                rows[self.ws[b] + j] = (self.table[b][p // bs], p % bs)
        if any(r is None for r in rows):  # cannot happen once the preconditions hold
            raise AssertionError("a gather row is owned by no request")
        return rows  # type: ignore[return-value]

    def records_loop(self, record: Callable[[int, int], Tensor] | None = None) -> Tensor:
        """``records`` from ``slots_loop`` on the CPU; ``record(block, entry)`` reads a record where
        the device cache does not hold them all (fp8_ds_mla's host tier)."""
        cache = self.cache.cpu()
        rows = [cache[block, entry] if record is None else record(block, entry) for block, entry in self.slots_loop()]
        return torch.stack(rows) if rows else cache.new_empty(0, self.record_bytes)
