"""Planted bugs of vLLM's newer convert surfaces (SPEC 9.2, 9.4) and look-alikes of the real bugs
reported against them (SPEC 9.5): caller-owned outputs, the DCP filter and the DCP peer-slot map.

Each is the correct algorithm with one named change (the ``bug``); the catalog (catalog.py) says
which finding each must draw and cites the report it resembles.
"""

from __future__ import annotations

import weakref

import torch

from mlafuzz.kernels.checks import check_dcp_filter_args, check_dcp_peer_args
from mlafuzz.kernels.revisions import filter_compacts
from mlafuzz.kernels.torch_impl import convert_torch

# --- caller-owned outputs (SPEC 9.2) ---------------------------------------------------------


def _before(out: torch.Tensor, row: torch.Tensor) -> None:
    """Store ``row`` as row -1 of ``out``: the elements just before its first one in its storage
    (a row slice of a caller's buffer: the buffer's row before it, or whatever lies there)."""
    flat = torch.empty(0, dtype=out.dtype, device=out.device)
    flat.set_(out.untyped_storage(), 0, (out.untyped_storage().nbytes() // out.element_size(),), (1,))
    start = out.storage_offset()
    n = min(row.numel(), start)
    flat[start - n : start] = row[row.numel() - n :]


class LastOut:
    """A loaded mutant's memory of the ``out=`` it was last given (weakly: it never keeps a case's
    buffer alive, and a freed one never matches a new tensor that reuses its address)."""

    def __init__(self) -> None:
        self.ref: weakref.ref | None = None

    def again(self, out: torch.Tensor) -> bool:
        """Whether ``out`` is the very tensor of the call before; remembers it for the next."""
        same = self.ref is not None and self.ref() is out
        self.ref = weakref.ref(out)
        return same


def deliver(
    bug: str,
    res: torch.Tensor,
    counts: torch.Tensor | None,
    valid: torch.Tensor,
    out: torch.Tensor | None,
    valid_counts_out: torch.Tensor | None,
    *,
    keep_out: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The results into the caller's buffers where given (``valid``: the output elements that hold
    a valid value), with the caller-owned output bugs:
    ``stale_invalid`` stores only the valid columns (an invalid one keeps the buffer's last value),
    ``tail_unwritten`` the same for a compacted row (its -1 tail left to a pre-fill the caller's
    buffer never had; the caller of a torch variant gets ``valid``: the prefix only),
    ``row_minus1`` stores a row without a valid column at row -1, the padding sentinel (the
    flash-attention #2755 class), ``fresh_out`` fills the buffers but returns copies,
    ``counts_not_zeroed`` adds the counts into valid_counts_out without zeroing it first.
    ``keep_out``: the call writes no element of ``out`` (it keeps the step before's rows)."""
    if out is not None:
        if keep_out:
            pass
        elif bug == "stale_invalid" or bug == "tail_unwritten":
            out[valid] = res[valid]
        elif bug == "row_minus1":
            empty = ~valid.reshape(res.shape[0], -1).any(dim=1) if res.numel() else torch.zeros(0, dtype=torch.bool)
            out[~empty] = res[~empty]
            for i in empty.nonzero().flatten().tolist():
                _before(out, res[i])  # the row's index read as the -1 of a padding row
        else:
            out.copy_(res)
        res = out.clone() if bug == "fresh_out" else out
    if counts is None:
        return res
    if valid_counts_out is not None:
        if bug == "counts_not_zeroed":
            valid_counts_out += counts  # the tiles' atomic adds, without the wrapper's zero_()
        else:
            valid_counts_out.copy_(counts)
        counts = valid_counts_out.clone() if bug == "fresh_out" else valid_counts_out
    return res, counts


# --- the convert's arguments from vLLM's releases (SPEC 10) --------------------------------------

#: bug -> the keyword the planted convert takes and drops: ``idx_mapping_ignored`` reads the table by
#: req_id (vLLM 0.33.0's mapping taken and never applied); ``rank_stride_ignored`` puts every rank's
#: prefill tokens in rank 0's part of the gathered workspace (vLLM 0.30.0's rank stride dropped).
RELEASE_BUGS = {"idx_mapping_ignored": "idx_mapping", "rank_stride_ignored": "prefill_workspace_rank_stride"}


def convert_release(bug: str, *args, **kwargs):
    """Our torch convert with the keyword of ``RELEASE_BUGS[bug]`` accepted and dropped."""
    kwargs.pop(RELEASE_BUGS[bug], None)
    return convert_torch(*args, **kwargs)


# --- DCP (SPEC 9.4) -----------------------------------------------------------------------------


def dcp(
    bug: str,
    req_id,
    block_table,
    token_indices,
    dcp_size,
    dcp_rank,
    cp_kv_cache_interleave_size=1,
    BLOCK_SIZE=64,
    NUM_TOPK_TOKENS=2048,
    BLOCK_N=128,
    return_valid_counts=False,
    compact_valid_to_front=True,
    *,
    revision=None,
):
    """The DCP filter with one bug: ``owner_no_interleave`` (the owner taken as t % D, as if the
    interleave were 1), ``global_block`` (the table read at the global position's block, not the
    local one), ``compact_hole`` (the prefix packed from every non-negative token before the owner
    filter: another rank's -1 inside the valid prefix, the vLLM #58058 class), ``handoff_compacts``
    (D == 1 packs rows as ``compact_valid_to_front`` asks, where vLLM hands the call to the plain
    convert, which leaves an uncounted row in place), ``local_width_table`` (the rank's table read
    as rows of its DCP-local width, not its row stride, the global width: vLLM #46514),
    ``no_length_check`` (a req_id longer than token_indices accepted: vLLM 0.27.0-0.34.0's filter
    lacks the check #48642 gave the convert; here the extra rows are dropped, so only the
    acceptance shows)."""
    if bug == "no_length_check":
        req_id = req_id[: token_indices.shape[0]]
    check_dcp_filter_args(
        req_id, block_table, token_indices, dcp_size, dcp_rank, cp_kv_cache_interleave_size, BLOCK_SIZE,
        NUM_TOPK_TOKENS, BLOCK_N,
    )  # fmt: skip
    d, i = dcp_size, cp_kv_cache_interleave_size
    t = token_indices.long().clamp(min=0)
    owner = (t // (1 if bug == "owner_no_interleave" else i)) % d
    local = t if bug == "global_block" else (t // (d * i)) * i + t % i
    mine = (token_indices >= 0) & (owner == dcp_rank)
    local_ti = torch.where(mine, local, -1).to(torch.int32)
    if bug == "local_width_table" and block_table.dim() == 2:
        # The buffer of cdiv(global width, D) columns filled by a copy bounded by its own size:
        # row r starts r * local width into the global-width rows (row 0 right, the rest mixed).
        block_table = torch.as_strided(block_table, block_table.shape, (block_table.shape[1], 1))
    out, counts = convert_torch(
        req_id, block_table, local_ti, BLOCK_SIZE, NUM_TOPK_TOKENS=NUM_TOPK_TOKENS, BLOCK_N=BLOCK_N,
        return_valid_counts=True,
    )  # fmt: skip
    compact = filter_compacts(d, compact_valid_to_front, return_valid_counts, revision)
    if bug == "handoff_compacts":
        compact = bool(compact_valid_to_front)
    if compact and out.numel():
        keep = (token_indices >= 0) if bug == "compact_hole" else (out != -1)
        out = torch.gather(out, 1, torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices)
    return (out, counts) if return_valid_counts else out


def dcp_peer(
    bug: str,
    req_id,
    block_table,
    token_indices,
    dcp_size,
    blocks_per_peer,
    cp_kv_cache_interleave_size=1,
    block_size=64,
    BLOCK_N=64,
    return_valid_counts=False,
    out=None,
    valid_counts_out=None,
):
    """The peer-slot map with one bug: ``no_space_check`` (no host check that the peer view's
    slots fit int32), ``no_peer_bound`` (a block id past blocks_per_peer kept: another peer's
    rows), ``owner_minor`` (the view taken owner-minor, (block * D + owner), not rank-major)."""
    check_dcp_peer_args(
        req_id, block_table, token_indices, dcp_size,
        min(blocks_per_peer, 1) if bug == "no_space_check" else blocks_per_peer,
        cp_kv_cache_interleave_size, block_size, BLOCK_N, out, valid_counts_out,
    )  # fmt: skip
    d, i, p, bs = dcp_size, cp_kv_cache_interleave_size, blocks_per_peer, block_size
    t = token_indices.long().clamp(min=0)
    owner, local = (t // i) % d, (t // (d * i)) * i + t % i
    lb = local // bs
    r, m = block_table.shape
    req = req_id.long()[:, None]
    ok = (token_indices >= 0) & (req >= 0) & (req < r) & (lb < m)
    entry = block_table[torch.where(ok, req, 0), torch.where(ok, lb, 0)].long() if r and m else torch.zeros_like(t)
    ok &= (entry >= 0) & ((entry < p) | (bug == "no_peer_bound"))
    block = entry * d + owner if bug == "owner_minor" else owner * p + entry
    slot = block * bs + local % bs
    res = torch.where(ok, slot, -1).to(torch.int32)
    return deliver(
        bug, res, ok.sum(dim=1, dtype=torch.int32) if return_valid_counts else None, ok, out, valid_counts_out
    )
