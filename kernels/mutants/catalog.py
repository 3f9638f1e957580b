"""The catalog of planted bugs: small, realistic mistakes the harness must catch.

Each mutant is a registry entry (``is_mutant=True``) with a one-line
description and the finding kind it should draw; ``mlafuzz mutants`` fuzzes
each one and reports killed or survived. Their code: torch variants in
torch_bugs.py (they run anywhere, so the catalog runs on CPU CI), bugs planted
in our CUDA kernels in csrc/mutants.cu (cuda_mutants.py), the crashing C++ host
check in host_throw.py. A mutant with both has one name: its CUDA kernel on the
GPU, its torch variant on the CPU.

``awaits`` marks a mutant whose bug class only shows on inputs the generators
do not draw yet; ``mutants`` reports it as awaiting rather than survived, and
says so when it is killed anyway (then the mark is stale). ``size`` names the
case sizes (``fuzz --size``) that draw what its bug needs: ``large`` for caches
past 2^32 bytes (SPEC 8), which small cases never reach. Unit tests build the
layouts by hand too (tests/kernels/test_mutant_kernels.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mlafuzz.kernels.builtins import (
    CONVERT_OPTIONS,
    CONVERT_RELEASE_OPTIONS,
    CUDA_GATHER_REJECTS,
    CUDA_WRITER_REJECTS,
    GATHER_OPTIONS,
)
from mlafuzz.kernels.checks import (
    CONVERT_REJECTS,
    DCP_PEER_REJECTS,
    DCP_REJECTS,
    GATHER_TORCH_REJECTS,
    WRITER_TORCH_REJECTS,
)
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.mutants.nvfp4_bugs import NVFP4_MUTANTS
from mlafuzz.kernels.mutants.nvfp4_writer_bugs import NVFP4_WRITER_MUTANTS
from mlafuzz.kernels.mutants.planner_bugs import PLANNER_MUTANTS
from mlafuzz.kernels.mutants.step_bugs import STEP_MUTANTS
from mlafuzz.kernels.revisions import CONVERT_REVISIONS, FILTER_REVISIONS, WRITER_REVISIONS


@dataclass(frozen=True, kw_only=True)
class Mutant:
    op: str
    name: str
    bug: str | None  # its torch variant's bug (torch_bugs.py); None: it has none
    kind: str
    description: str
    devices: tuple[str, ...] = ("cpu", "cuda")
    # A writer mutant of one revision's rule is pinned to it (judged under it whatever the run
    # names); None: it follows the run's revision like our writers (a bug outside the scale rule).
    revision: str | None = None
    capabilities: frozenset[str] = frozenset({"seq_starts"})  # optional SPEC features its signature has
    cuda_bug: str | None = None  # its bug planted in our CUDA kernel (mutants.cu), used on the GPU
    awaits: str | None = None  # the drawn inputs its bug needs that the generators do not draw yet
    size: str = "small"  # the case sizes (fuzz --size) that draw the inputs its bug needs
    # The family it belongs to, for `mutants`' per-group recall: "core" (the original catalog),
    # "vllm-reports" (look-alikes of bugs reported against vLLM and its neighbours, SPEC 9.5, each
    # citing its report), or the new surface it plants a bug in ("host-tier", "caller-out", "dcp").
    group: str = "core"


CATALOG: tuple[Mutant, ...] = (
    Mutant(
        op="convert",
        name="convert_minus1_only",
        bug="minus1_only",
        kind="VALUE_MISMATCH",
        description="only -1 is treated as padding; other negatives index the table",
    ),
    Mutant(
        op="convert",
        name="convert_block_edge",
        bug="block_edge",
        kind="VALUE_MISMATCH",
        description="block index checked with <= width: off by one at the table's edge",
    ),
    Mutant(
        op="convert",
        name="convert_count_all",
        bug="count_all",
        kind="VALUE_MISMATCH",
        description="valid_counts counts every column that is not -1, invalid ones included",
    ),
    Mutant(
        op="convert",
        name="convert_prefill_no_bound",
        bug="prefill_no_table_bound",
        kind="VALUE_MISMATCH",
        description="prefill rows skip the block-table bound check",
    ),
    Mutant(
        op="convert",
        name="convert_row_as_request",
        bug="row_as_request",
        kind="VALUE_MISMATCH",
        description="looks up the block table by row index instead of req_id",
    ),
    Mutant(
        op="convert",
        name="convert_no_length_check",
        bug="no_length_check",
        kind="ACCEPTED_INVALID_INPUT",
        description="grid over req_id rows, no length check (the pre-#48642 launch), torch variant",
    ),
    Mutant(
        op="convert",
        name="convert_stride_ignored",
        bug="stride_ignored",
        kind="VALUE_MISMATCH",
        capabilities=CONVERT_OPTIONS,
        description="takes BLOCK_STRIDE_ROWS but multiplies the table entry by BLOCK_SIZE",
    ),
    Mutant(
        op="convert",
        name="convert_compact_tile_restart",
        bug="compact_tile_restart",
        kind="VALUE_MISMATCH",
        capabilities=CONVERT_OPTIONS,
        description="COMPACT_TO_FRONT packs each BLOCK_N tile from column 0 again: later tiles overwrite",
    ),
    Mutant(
        op="gather",
        name="gather_no_seq_starts",
        bug="no_seq_starts",
        kind="VALUE_MISMATCH",
        description="reads every request from position 0 (seq_starts ignored)",
    ),
    Mutant(
        op="gather",
        name="gather_wrong_scale_tile",
        bug="wrong_scale_tile",
        kind="VALUE_MISMATCH",
        description="tiles 1 and 2 use each other's scale",
    ),
    Mutant(
        op="gather",
        name="gather_truncate_bf16",
        bug="truncate_bf16",
        kind="VALUE_MISMATCH",
        description="f32 -> bf16 by truncation instead of round to nearest even",
    ),
    Mutant(
        op="gather",
        name="gather_flush_subnormal",
        bug="flush_subnormal",
        kind="SUBNORMAL_FLUSH",
        description="flushes subnormal products to zero (a fast-math build)",
    ),
    Mutant(
        op="gather",
        name="gather_nan_to_zero",
        bug="nan_to_zero",
        kind="NAN_MISMATCH",
        description="NaN products swallowed to 0",
    ),
    Mutant(
        op="gather",
        name="gather_rope_as_fp16",
        bug="rope_as_fp16",
        kind="VALUE_MISMATCH",
        description="rope bits read as fp16 and converted instead of copied",
    ),
    Mutant(
        op="gather",
        name="gather_skip_last_row",
        bug="skip_last_row",
        kind="MISSING_WRITE",
        description="the last row of dst is never written",
    ),
    Mutant(
        op="gather",
        name="gather_one_row_too_far",
        bug="one_row_too_far",
        kind="OOB_WRITE",
        description="writes one row past the end of dst",
    ),
    Mutant(
        op="gather",
        name="gather_empty_request_owner",
        bug="empty_request_owner",
        kind="VALUE_MISMATCH",
        description="rows at an empty request's start are given to the empty request",
    ),
    Mutant(
        op="gather",
        name="gather_nondeterministic",
        bug="nondeterministic",
        kind="NONDETERMINISM",
        description="a race: one element differs between two runs",
    ),
    Mutant(
        op="gather",
        name="gather_mutates_cache",
        bug="mutates_cache",
        kind="INPUT_MUTATION",
        description="zeroes a cache record it read",
    ),
    Mutant(
        op="gather",
        name="gather_no_value_checks",
        bug="no_value_checks",
        kind="ACCEPTED_INVALID_INPUT",
        description="promises the host-side ws/seq_starts checks but skips them",
    ),
    Mutant(
        op="writer",
        name="writer_scale_pow2",
        bug="scale_pow2",
        kind="VALUE_MISMATCH",
        revision="2026-07",
        description="rounds the tile scale up to a power of two (the 2026-09 rule where 2026-07 holds)",
    ),
    Mutant(
        op="writer",
        name="writer_round_down",
        bug="round_down",
        kind="VALUE_MISMATCH",
        revision="2026-09",
        description="2026-09 scale rounded down to a power of two (floor, not ceil)",
    ),
    Mutant(
        op="writer",
        name="writer_floor_on_amax",
        bug="floor_on_amax",
        kind="VALUE_MISMATCH",
        revision="2026-09",
        description="2026-09 1e-4 floor applied to amax before / 448, not to the scale",
    ),
    Mutant(
        op="writer",
        name="writer_no_ceiling",
        bug="no_ceiling",
        kind="VALUE_MISMATCH",
        revision="2026-09",
        description="2026-09 scale floored at 1e-4 but not rounded to a power of two",
    ),
    Mutant(
        op="writer",
        name="writer_fp16_bits_2026_07",
        bug="fp16_bits",
        kind="VALUE_MISMATCH",
        revision="2026-07",
        description="fp16 amax from the raw 16-bit patterns, as vLLM's native writer (2026-07)",
    ),
    Mutant(
        op="writer",
        name="writer_fp16_bits_2026_09",
        bug="fp16_bits",
        kind="VALUE_MISMATCH",
        revision="2026-09",
        description="fp16 amax from the raw 16-bit patterns, as vLLM's native writer (2026-09)",
    ),
    Mutant(
        op="writer",
        name="writer_writes_padding",
        bug="writes_padding",
        kind="VALUE_MISMATCH",
        description="padding tokens (slot -1) are written to slot 0",
    ),
    # Issue 16: a launch that is never checked.
    Mutant(
        op="writer",
        name="writer_zero_grid",
        bug=None,
        cuda_bug="zero_grid",
        kind="LAUNCH_ERROR",
        devices=("cuda",),
        description="num_tokens == 0 launches a zero-size grid and never checks the launch (vLLM's writer)",
    ),
    # Issue 17: the call sites' layouts and real cache sizes (SPEC 8). The kinds are what the
    # harness sees first on the drawn or hand-built layout: a wrong record read is a VALUE_MISMATCH;
    # rows written from dst's storage start land in the guard zone before dst: OOB_WRITE.
    Mutant(
        op="gather",
        name="gather_int32_offset",
        bug=None,
        cuda_bug="int32_offset",
        kind="VALUE_MISMATCH",
        devices=("cuda",),
        size="large",  # 1 large case in 20 sits past 2^31 or 2^32 bytes
        description="record byte offset block * block_stride + off * 656 computed in int32 (CUDA kernel)",
    ),
    Mutant(
        op="gather",
        name="gather_contiguous_table",
        bug="contiguous_table",
        cuda_bug="contiguous_table",
        kind="VALUE_MISMATCH",
        description="block_table indexed as b * width + blk: row stride assumed = width (CUDA kernel; torch on cpu)",
    ),
    Mutant(
        op="gather",
        name="gather_dst_storage_start",
        bug="dst_storage_start",
        cuda_bug="dst_storage_start",
        kind="OOB_WRITE",
        description="dst rows written from its storage's start, not its data_ptr (CUDA kernel; torch on cpu)",
    ),
    Mutant(
        op="writer",
        name="writer_contiguous_kv_c",
        bug="contiguous_kv_c",
        cuda_bug="contiguous_kv_c",
        kind="VALUE_MISMATCH",
        description="kv_c / k_pe read as contiguous [T, 512] / [T, 64], row strides ignored (CUDA kernel; torch on cpu)",
    ),
    # --- SPEC 9.5: look-alikes of real bugs reported against the convert and its neighbours ---
    Mutant(
        op="convert",
        name="convert_invalid_to_zero",
        bug="invalid_to_zero",
        kind="VALUE_MISMATCH",
        group="vllm-reports",
        description="an invalid index converted to 0 instead of -1, so slot 0 is attended (vLLM #45324)",
    ),
    Mutant(
        op="dcp",
        name="dcp_compact_hole",
        bug="compact_hole",
        kind="VALUE_MISMATCH",
        group="vllm-reports",
        description="compaction packs every non-negative token before the rank filter: a -1 inside the"
        " valid prefix (vLLM #58058)",
    ),
    Mutant(
        op="dcp",
        name="dcp_local_width_table",
        bug="local_width_table",
        kind="VALUE_MISMATCH",
        capabilities=frozenset(),
        group="vllm-reports",
        description="the rank's block table copied into a buffer of the DCP-local width, cdiv(global"
        " width, D), by a copy bounded by the buffer: every row after the first mixes another"
        " request's block ids (vLLM #46514)",
    ),
    Mutant(
        op="convert",
        name="convert_out_row_minus1",
        bug="row_minus1",
        kind="OOB_WRITE",
        capabilities=CONVERT_OPTIONS,
        group="vllm-reports",
        description="a row without a valid column is stored at row -1, the padding sentinel: the row"
        " just before the caller's out slice (flash-attention #2755)",
    ),
    Mutant(
        op="convert",
        name="convert_logical_width",
        bug="logical_width",
        kind="VALUE_MISMATCH",
        group="vllm-reports",
        description="the block table addressed by its logical width instead of its row stride (vLLM #55184)",
    ),
    Mutant(
        op="writer",
        name="writer_padding_nan_slot0",
        bug="padding_nan_slot0",
        kind="VALUE_MISMATCH",
        group="vllm-reports",
        description="padding rows (slot -1), their activations NaN, written to the reserved slot 0 instead of"
        " nowhere: a NaN record where a real token's may be read (sglang #36207)",
    ),
    Mutant(
        op="writer",
        name="writer_layer_base_offset",
        bug="layer_base_offset",
        kind="VALUE_MISMATCH",
        group="vllm-reports",
        description="records written from the start of kv_cache's storage, its view's offset ignored: every"
        " layer of a packed multi-layer cache written at the base offset, layer 0 (vLLM #57019)",
    ),
    Mutant(
        op="writer",
        name="writer_skip_scale_tile",
        bug="skip_scale_tile",
        kind="VALUE_MISMATCH",
        capabilities=frozenset({"seq_starts", "skip_scale"}),
        group="core",
        description="skip_scale=True taken to skip the per-tile scales too: codes of the raw values"
        " saturated, scales stored as 1.0 (vLLM 0.33.0's flag skips only the global k_scale)",
    ),
    # --- SPEC 9.2: caller-owned outputs ---
    Mutant(
        op="convert",
        name="convert_out_stale_invalid",
        bug="stale_invalid",
        kind="MISSING_WRITE",
        capabilities=CONVERT_OPTIONS,
        group="caller-out",
        description="with out= given, stores only the valid columns: an invalid one keeps the last step's value",
    ),
    Mutant(
        op="convert",
        name="convert_counts_not_zeroed",
        bug="counts_not_zeroed",
        kind="MISSING_WRITE",
        capabilities=CONVERT_OPTIONS,
        group="caller-out",
        description="adds the counts into valid_counts_out without zeroing it first (the buffer's"
        " old bytes survive under the sums)",
    ),
    Mutant(
        op="convert",
        name="convert_out_not_returned",
        bug="fresh_out",
        kind="VALUE_MISMATCH",
        capabilities=CONVERT_OPTIONS,
        group="caller-out",
        description="fills the caller's out / valid_counts_out but returns copies (cause out:not_callers)",
    ),
    Mutant(
        op="convert",
        name="convert_out_stale_compacted",
        bug="stale_compacted",
        kind="MISSING_WRITE",
        capabilities=CONVERT_OPTIONS,
        group="caller-out",
        description="with out= and COMPACT_TO_FRONT, a second call through the same buffer writes none of"
        " its rows (reuse keyed on the buffer, not the step): the step before's compacted rows survive",
    ),
    # --- SPEC 10: the convert as vLLM 0.30.0 on launches it (a counted row compacted) ---
    Mutant(
        op="convert",
        name="convert_compact_hole",
        bug="compact_hole",
        kind="VALUE_MISMATCH",
        group="vllm-reports",
        description="a counted row compacted from every non-negative token before the table bound: a -1"
        " inside the valid prefix (vLLM #58058, under the 0.30.0 rule that compacts counted rows)",
    ),
    Mutant(
        op="convert",
        name="convert_compact_tail_unwritten",
        bug="tail_unwritten",
        kind="MISSING_WRITE",
        capabilities=CONVERT_OPTIONS,
        group="caller-out",
        description="a compacted row stores only its prefix and leaves its tail to a -1 pre-fill the"
        " caller's out= never had: the previous step's slots survive there (vLLM #51323's review)",
    ),
    Mutant(
        op="convert",
        name="convert_idx_mapping_ignored",
        bug="idx_mapping_ignored",
        kind="VALUE_MISMATCH",
        capabilities=CONVERT_RELEASE_OPTIONS,
        group="releases",
        description="takes idx_mapping (vLLM 0.33.0) and reads the block table by req_id as before",
    ),
    Mutant(
        op="convert",
        name="convert_rank_stride_ignored",
        bug="rank_stride_ignored",
        kind="VALUE_MISMATCH",
        capabilities=CONVERT_RELEASE_OPTIONS,
        group="releases",
        description="takes prefill_workspace_rank_stride (vLLM 0.30.0) and drops it: another rank's"
        " prefill token read from rank 0's part of the gathered workspace",
    ),
    Mutant(
        op="dcp_peer",
        name="dcp_peer_out_stale_invalid",
        bug="stale_invalid",
        kind="MISSING_WRITE",
        capabilities=frozenset({"caller_out"}),
        group="caller-out",
        description="peer-slot map with out= given stores only the valid columns (vLLM's tests pre-fill -99)",
    ),
    # --- SPEC 9.4: DCP rank filtering ---
    Mutant(
        op="dcp",
        name="dcp_owner_no_interleave",
        bug="owner_no_interleave",
        kind="VALUE_MISMATCH",
        capabilities=frozenset(),
        group="dcp",
        description="the owning rank computed as t % D, the interleave ignored",
    ),
    Mutant(
        op="dcp",
        name="dcp_no_length_check",
        bug="no_length_check",
        kind="ACCEPTED_INVALID_INPUT",
        capabilities=frozenset(),
        group="vllm-reports",
        description="a req_id longer than token_indices accepted: the length check of vLLM #48642 missing from"
        " the DCP filter, as in every release 0.27.0-0.34.0 (docs/vllm.md; the release tier's ledger)",
    ),
    Mutant(
        op="dcp",
        name="dcp_global_block",
        bug="global_block",
        kind="VALUE_MISMATCH",
        capabilities=frozenset(),
        group="dcp",
        description="the table read at the global position's block and offset, not the rank-local one",
    ),
    Mutant(
        op="dcp",
        name="dcp_handoff_compacts",
        bug="handoff_compacts",
        kind="VALUE_MISMATCH",
        capabilities=frozenset(),
        group="dcp",
        description="D == 1 packs an uncounted row to the front: vLLM hands D == 1 to the plain convert,"
        " which drops compact_valid_to_front (every release) and leaves such a row in place",
    ),
    Mutant(
        op="dcp_peer",
        name="dcp_peer_no_bound",
        bug="no_peer_bound",
        kind="VALUE_MISMATCH",
        capabilities=frozenset({"caller_out"}),
        group="dcp",
        description="keeps a block id >= blocks_per_peer: a slot in the next peer's rows",
    ),
    Mutant(
        op="dcp_peer",
        name="dcp_peer_owner_minor",
        bug="owner_minor",
        kind="VALUE_MISMATCH",
        capabilities=frozenset({"caller_out"}),
        group="dcp",
        description="the peer view taken owner-minor (block * D + owner) instead of rank-major",
    ),
    Mutant(
        op="dcp_peer",
        name="dcp_peer_no_space_check",
        bug="no_space_check",
        kind="ACCEPTED_INVALID_INPUT",
        capabilities=frozenset({"caller_out"}),
        group="dcp",
        description="no host check that dcp_size * blocks_per_peer * block_size fits int32: slots wrap",
    ),
)


# Look-alikes of the gather/writer-side bugs SPEC 9.5 lists, and bugs planted in the gather's host
# tier (SPEC 9.3). vLLM #55184's table addressing is gather_contiguous_table above and its int32
# offsets gather_int32_offset (cited, not duplicated).
GATHER_REPORTS_AND_HOST_TIER: tuple[Mutant, ...] = (
    Mutant(
        op="gather",
        name="gather_seq_start_past_row",
        bug="seq_start_past_row",
        kind="ACCEPTED_INVALID_INPUT",
        group="vllm-reports",
        description="vLLM #27909 / #45380: the table bound checked on the length alone, so a seq_start "
        "pushing (seq_start + j) // bs past the row reads a later row's block ids",
    ),
    Mutant(
        op="gather",
        name="gather_scale_inverted",
        bug="scale_inverted",
        kind="VALUE_MISMATCH",
        group="vllm-reports",
        description="FlashMLA #184: reader and writer disagree on the scale encoding: the stored scale "
        "is taken for its inverse (code / scale), a writer-to-reader round trip does not hold",
    ),
    Mutant(
        op="gather",
        name="gather_host_choice_inverted",
        bug="host_choice_inverted",
        kind="VALUE_MISMATCH",
        group="host-tier",
        capabilities=GATHER_OPTIONS,
        description="host tier: the device/host choice inverted (device_row_ids >= 0 read from the host)",
    ),
    Mutant(
        op="gather",
        name="gather_host_by_position",
        bug="host_by_position",
        kind="VALUE_MISMATCH",
        group="host-tier",
        capabilities=GATHER_OPTIONS,
        description="host tier: host_row_ids indexed by the dst row instead of the source slot",
    ),
    Mutant(
        op="gather",
        name="gather_device_row0_absent",
        bug="device_row0_absent",
        kind="VALUE_MISMATCH",
        group="host-tier",
        capabilities=GATHER_OPTIONS,
        description="host tier: device row 0 taken for 'absent' (> 0 instead of >= 0), read from the host",
    ),
    Mutant(
        op="gather",
        name="gather_host_tier_ignored",
        bug="host_tier_ignored",
        kind="VALUE_MISMATCH",
        group="host-tier",
        capabilities=GATHER_OPTIONS,
        description="host tier: takes the three arguments and ignores them (every slot read from the device cache)",
    ),
)
CATALOG = CATALOG + GATHER_REPORTS_AND_HOST_TIER


REJECTS = {
    "convert": CONVERT_REJECTS,
    "gather": GATHER_TORCH_REJECTS,
    "writer": WRITER_TORCH_REJECTS,
    "dcp": DCP_REJECTS,
    "dcp_peer": DCP_PEER_REJECTS,
}
# A mutant with a CUDA kernel is held to that kernel's contract on every device (its torch variant
# refuses more on the CPU, which a contract never forbids).
KERNEL_REJECTS = {"gather": CUDA_GATHER_REJECTS, "writer": CUDA_WRITER_REJECTS}


def _loader(op: str, bug: str | None, cuda_bug: str | None, revision: str | None) -> Callable[[str], Callable]:
    def load(device: str) -> Callable:
        if device == "cuda" and cuda_bug is not None:
            from mlafuzz.kernels.mutants import cuda_mutants

            return getattr(cuda_mutants, op)(cuda_bug, revision=revision)
        from mlafuzz.kernels.mutants import torch_bugs

        return torch_bugs.load(op, bug, revision=revision)

    return load


def _prepare_cuda_bug(device: str) -> None:
    if device == "cuda":
        from mlafuzz.kernels.mutants import cuda_mutants

        cuda_mutants.load_extension()


#: The revisions an op's mutants without a pin follow, as ours do (by a keyword-only ``revision=``).
_FOLLOWS = {
    "writer": frozenset(WRITER_REVISIONS),
    "convert": frozenset(CONVERT_REVISIONS),
    "dcp": frozenset(FILTER_REVISIONS),
}


def _revisions(m: Mutant) -> frozenset[str] | None:
    """What a mutant's entry follows: a writer or convert mutant without a pin follows every
    revision its op's rule has (a convert's: whether a counted row is compacted), a DCP filter's
    every revision (its D == 1 hand-off asks ``convert_counted``)."""
    return _FOLLOWS.get(m.op) if m.revision is None else None


def _overwide_loader(device: str) -> Callable:
    from mlafuzz.kernels.mutants import torch_bugs

    return torch_bugs.triton_overwide()


def _cpp_throw_loader(device: str) -> Callable:
    from mlafuzz.kernels.mutants import host_throw

    return host_throw.gather_cpp_throw(device)


def _cpp_throw_prepare(device: str) -> None:
    from mlafuzz.kernels.mutants import host_throw

    host_throw.build()
    if device == "cuda":  # on valid inputs it is our CUDA gather
        from mlafuzz.kernels import cuda_ext

        cuda_ext.load_extension()


MUTANTS: tuple[ImplEntry, ...] = (
    tuple(
        ImplEntry(
            op=m.op,
            name=m.name,
            loader=_loader(m.op, m.bug, m.cuda_bug, m.revision),
            devices=frozenset(m.devices),
            rejects=KERNEL_REJECTS[m.op] if m.cuda_bug else REJECTS[m.op],
            description=m.description,
            expected_kind=m.kind,
            is_mutant=True,
            revision=m.revision,
            revisions=_revisions(m),
            capabilities=m.capabilities,
            awaits=m.awaits,
            size=m.size,
            group=m.group,
            prepare=_prepare_cuda_bug if m.cuda_bug else None,
        )
        for m in CATALOG
    )
    + (
        ImplEntry(
            op="convert",
            name="triton_overwide",
            loader=_overwide_loader,
            devices=frozenset({"cuda"}),
            rejects=CONVERT_REJECTS,
            expected_kind="OOB_WRITE",
            is_mutant=True,
            revisions=_FOLLOWS["convert"],
            requires=("triton",),
            description="Triton kernel launched over req_id rows while out has token_indices rows (pre-#48642)",
        ),
        # Issue 16: a crash-prone error-input class. Its kind is CRASH, so `mutants` runs it in a worker.
        ImplEntry(
            op="gather",
            name="gather_cpp_throw",
            loader=_cpp_throw_loader,
            devices=frozenset({"cpu", "cuda"}),
            rejects=CUDA_GATHER_REJECTS,
            expected_kind="CRASH",
            is_mutant=True,
            tools=("g++",),
            prepare=_cpp_throw_prepare,
            description="its C++ host check throws on a non-bf16 dst and the process aborts (vLLM on the H200); else ours",
        ),
    )
    + PLANNER_MUTANTS  # the packing chunk planner's (SPEC 9.1): planner_bugs.py
    + STEP_MUTANTS  # the step pipeline's (SPEC 5): step_bugs.py
    + NVFP4_MUTANTS  # the nvfp4_ds_mla gather's (SPEC 11): nvfp4_bugs.py
    + NVFP4_WRITER_MUTANTS  # the nvfp4_ds_mla writer's (SPEC 11.3): nvfp4_writer_bugs.py
)
