"""Host-side precondition checks shared by our convert / gather / writer kernels.

Every check runs before any launch and raises an ``InvalidInputError`` (a
``ValueError``) or, for dtype and type problems, an ``InvalidDtypeError``
(both a ``TypeError`` and an ``InvalidInputError``). Where vLLM's convert
refuses with an ``assert`` (its dtypes, the row-count match, K against
NUM_TOPK_TOKENS and BLOCK_N, the prefill arguments), ours raises an
``AssertedInputError`` / ``AssertedDtypeError``: the same classes, and an
``AssertionError`` too, so code written against vLLM (its tests'
``pytest.raises(AssertionError)``, a caller's ``except AssertionError``)
catches our refusals as it catches vLLM's. Each error carries a
``reason`` drawn from the vocabulary the harness uses for invalid-input
classes, so a contract (``CONVERT_REJECTS``, ``GATHER_TORCH_REJECTS``,
``WRITER_TORCH_REJECTS``) can name what an implementation promises to reject.

Messages follow the ``name=value`` style: ``req_id.shape[0]=5 !=
token_indices.shape[0]=4``.

This module imports torch only (no triton, no oracles), so both the Triton
kernel's wrapper and the torch reference implementations can share it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from mlafuzz.oracles.formats.table import get as get_format

__all__ = [
    "InvalidInputError",
    "InvalidDtypeError",
    "AssertedInputError",
    "AssertedDtypeError",
    "CONVERT_REJECTS",
    "GATHER_TORCH_REJECTS",
    "WRITER_TORCH_REJECTS",
    "RECORD_BYTES",
    "NOPE_DIM",
    "ROPE_DIM",
    "ROW_DIM",
    "check_convert_args",
    "check_release_args",
    "check_dcp_filter_args",
    "check_dcp_peer_args",
    "DCP_REJECTS",
    "DCP_PEER_REJECTS",
    "check_gather_args",
    "check_gather_values",
    "check_gather_host_args",
    "check_gather_host_rows",
    "GATHER_HOST_ARG_REJECTS",
    "check_block_ids",
    "check_writer_args",
]

# fp8_ds_mla's record, as the format table has it: 512 fp8 codes + 4 f32 scales + 64 bf16 rope values.
_FP8 = get_format("fp8_ds_mla")
RECORD_BYTES = _FP8.record_bytes
NOPE_DIM = _FP8.nope_dim
ROPE_DIM = _FP8.rope_dim
ROW_DIM = _FP8.row_dim  # bf16 values in a dequantized row
_INT32_MAX = 2**31 - 1

# Invalid-input classes that convert (Triton and torch) rejects before launch.
CONVERT_REJECTS = frozenset(
    {
        "length_mismatch",  # req_id.shape[0] != token_indices.shape[0] (PR #48642)
        "wrong_dtype",  # any index tensor not int32 (or not a tensor)
        "k_mismatch",  # token_indices.shape[1] != NUM_TOPK_TOKENS
        "k_not_multiple_of_block_n",  # NUM_TOPK_TOKENS % BLOCK_N != 0
        "bad_block_size",  # BLOCK_SIZE < 1 (or not an int / too large)
        "bad_block_n",  # BLOCK_N < 1 or not a power of two (tile width)
        "wrong_shape",  # wrong number of dims; prefill ids length != N
        "device_mismatch",  # tensors on different devices
        "missing_prefill_args",  # HAS_PREFILL_WORKSPACE without ids/starts
        "bad_block_stride",  # BLOCK_STRIDE_ROWS given but not an int >= 1 (SPEC section 7)
    }
)

# SPEC 9.4: what our DCP filter (Triton and torch) and the torch peer-slot map reject before launch.
DCP_REJECTS = frozenset(
    {
        "length_mismatch",
        "wrong_dtype",
        "k_mismatch",
        "k_not_multiple_of_block_n",
        "bad_block_size",
        "bad_block_n",
        "wrong_shape",
        "device_mismatch",
        "bad_dcp_size",  # dcp_size < 1
        "bad_dcp_rank",  # dcp_rank outside [0, dcp_size)
        "interleave_not_dividing_block",  # BLOCK_SIZE % cp_kv_cache_interleave_size != 0
    }
)
DCP_PEER_REJECTS = frozenset(
    {
        "length_mismatch",
        "wrong_dtype",
        "bad_block_size",
        "bad_block_n",
        "wrong_shape",
        "device_mismatch",
        "bad_dcp_size",
        "bad_blocks_per_peer",  # blocks_per_peer < 1
        "interleave_not_dividing_block",
        "peer_space_overflow",  # dcp_size * blocks_per_peer * block_size past int32: slots would wrap
    }
)

# Invalid-input classes that gather_torch rejects before touching dst.
GATHER_TORCH_REJECTS = frozenset(
    {
        "wrong_dtype",
        "wrong_shape",
        "device_mismatch",
        "ws0_nonzero",
        "ws_decreasing",
        "ws_past_total",
        "block_index_past_table",
        "block_id_past_cache",
        "negative_seq_start",
        # The host tier (SPEC 9.3): its arguments' shapes, dtypes and devices. gather_torch refuses
        # the rows it reads out of range too (slot_past_row_map, host_row_past_cache,
        # device_row_past_cache: tests/kernels/test_gather_host_tier.py), classes the fuzz loop
        # does not turn through.
        *("host_args_partial", "host_wrong_dtype", "host_wrong_device", "host_maps_unequal"),
    }
)

# What our CUDA gather checks of the host tier on the host (no value reads).
GATHER_HOST_ARG_REJECTS = frozenset({"host_args_partial", "host_wrong_dtype", "host_wrong_device", "host_maps_unequal"})

# Invalid-input classes that writer_torch rejects before touching the cache.
WRITER_TORCH_REJECTS = frozenset(
    {
        "wrong_dtype",
        "wrong_shape",
        "device_mismatch",
        "unsupported_kv_cache_dtype",
        "slot_past_cache",
    }
)


class InvalidInputError(ValueError):
    """A precondition violation found on the host before any launch."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"[{reason}] {message}")
        self.reason = reason


class InvalidDtypeError(InvalidInputError, TypeError):
    """A tensor of the wrong dtype, or a non-tensor where a tensor belongs."""


class AssertedInputError(InvalidInputError, AssertionError):
    """A refusal where vLLM's convert asserts: also an AssertionError (drop-in behaviour)."""


class AssertedDtypeError(InvalidDtypeError, AssertedInputError):
    """A dtype refusal where vLLM's convert asserts: a TypeError and an AssertionError."""


def _require_tensor(name: str, t: object, error: type[InvalidDtypeError] = InvalidDtypeError) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise error("wrong_dtype", f"{name} must be a torch.Tensor, got {name}={type(t).__name__}")
    return t


def _require_dtype(
    name: str, t: torch.Tensor, dtypes: Sequence[torch.dtype], error: type[InvalidDtypeError] = InvalidDtypeError
) -> None:
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise error("wrong_dtype", f"{name}.dtype={t.dtype}, expected {want}")


def _require_dim(name: str, t: torch.Tensor, ndim: int) -> None:
    if t.dim() != ndim:
        raise InvalidInputError("wrong_shape", f"{name}.dim()={t.dim()}, expected {ndim} (shape={tuple(t.shape)})")


def _require_int(name: str, v: object, reason: str, lo: int, hi: int = _INT32_MAX) -> int:
    # bool is an int subclass; True as a block size is a bug at the call site.
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidInputError(reason, f"{name}={v!r} must be a Python int")
    if not lo <= v <= hi:
        raise InvalidInputError(reason, f"{name}={v} must be in [{lo}, {hi}]")
    return v


def _require_same_device(named: Sequence[tuple[str, torch.Tensor | None]]) -> None:
    present = [(n, t) for n, t in named if t is not None]
    n0, t0 = present[0]
    for n, t in present[1:]:
        if t.device != t0.device:
            raise InvalidInputError("device_mismatch", f"{n}.device={t.device} != {n0}.device={t0.device}")


def check_convert_args(
    req_id: object,
    block_table: object,
    token_indices: object,
    BLOCK_SIZE: object,
    NUM_TOPK_TOKENS: object,
    BLOCK_N: object,
    HAS_PREFILL_WORKSPACE: object,
    prefill_workspace_request_ids: object,
    prefill_workspace_starts: object,
    *,
    BLOCK_STRIDE_ROWS: object = None,
    out: object = None,
    valid_counts_out: object = None,
) -> None:
    """Reject, on the host and before launch, every input SPEC §3 says to reject.

    Order: tensor types and dtypes, dims, devices, the constexpr-like ints,
    K against NUM_TOPK_TOKENS and BLOCK_N, the row-count match, the prefill
    arguments. Nothing here reads tensor *values* (no device sync). What vLLM
    asserts raises an ``AssertedInputError`` (see the module docstring).
    ``BLOCK_STRIDE_ROWS`` (SPEC §7): None, or an int >= 1.
    """
    ri = _require_tensor("req_id", req_id, AssertedDtypeError)
    bt = _require_tensor("block_table", block_table, AssertedDtypeError)
    ti = _require_tensor("token_indices", token_indices, AssertedDtypeError)
    for name, t in (("req_id", ri), ("block_table", bt), ("token_indices", ti)):
        _require_dtype(name, t, (torch.int32,), AssertedDtypeError)
    if not isinstance(HAS_PREFILL_WORKSPACE, (bool, int)):
        raise InvalidDtypeError("wrong_dtype", f"HAS_PREFILL_WORKSPACE={HAS_PREFILL_WORKSPACE!r} must be a bool")
    ids = starts = None
    if HAS_PREFILL_WORKSPACE:
        if prefill_workspace_request_ids is None or prefill_workspace_starts is None:
            raise AssertedInputError(
                "missing_prefill_args",
                "HAS_PREFILL_WORKSPACE=True needs prefill_workspace_request_ids and "
                f"prefill_workspace_starts, got prefill_workspace_request_ids="
                f"{None if prefill_workspace_request_ids is None else 'tensor'}, "
                f"prefill_workspace_starts={None if prefill_workspace_starts is None else 'tensor'}",
            )
        ids = _require_tensor("prefill_workspace_request_ids", prefill_workspace_request_ids, AssertedDtypeError)
        starts = _require_tensor("prefill_workspace_starts", prefill_workspace_starts, AssertedDtypeError)
        _require_dtype("prefill_workspace_request_ids", ids, (torch.int32,), AssertedDtypeError)
        _require_dtype("prefill_workspace_starts", starts, (torch.int32,), AssertedDtypeError)
    _require_dim("req_id", ri, 1)
    _require_dim("block_table", bt, 2)
    _require_dim("token_indices", ti, 2)
    if ids is not None:
        _require_dim("prefill_workspace_request_ids", ids, 1)
        _require_dim("prefill_workspace_starts", starts, 1)
    _require_same_device(
        [
            ("req_id", ri),
            ("block_table", bt),
            ("token_indices", ti),
            ("prefill_workspace_request_ids", ids),
            ("prefill_workspace_starts", starts),
        ]
    )
    _require_int("BLOCK_SIZE", BLOCK_SIZE, "bad_block_size", 1)
    if BLOCK_STRIDE_ROWS is not None:
        _require_int("BLOCK_STRIDE_ROWS", BLOCK_STRIDE_ROWS, "bad_block_stride", 1)
    bn = _require_int("BLOCK_N", BLOCK_N, "bad_block_n", 1)
    if bn & (bn - 1):
        raise InvalidInputError("bad_block_n", f"BLOCK_N={bn} must be a power of two")
    k = _require_int("NUM_TOPK_TOKENS", NUM_TOPK_TOKENS, "k_mismatch", 0)
    if ti.shape[1] != k:
        raise AssertedInputError("k_mismatch", f"token_indices.shape[1]={ti.shape[1]} != NUM_TOPK_TOKENS={k}")
    if k % bn:
        raise AssertedInputError("k_not_multiple_of_block_n", f"NUM_TOPK_TOKENS={k} % BLOCK_N={bn} = {k % bn} != 0")
    if ri.shape[0] != ti.shape[0]:
        raise AssertedInputError(
            "length_mismatch", f"req_id.shape[0]={ri.shape[0]} != token_indices.shape[0]={ti.shape[0]}"
        )
    if ids is not None and ids.shape[0] != ti.shape[0]:
        raise InvalidInputError(
            "wrong_shape",
            f"prefill_workspace_request_ids.shape[0]={ids.shape[0]} != token_indices.shape[0]={ti.shape[0]}",
        )
    check_caller_outputs(out, valid_counts_out, rows=ti.shape[0], cols=ti.shape[1], device=ti.device)


def check_release_args(
    *,
    idx_mapping: object,
    dcp_size: object,
    dcp_rank: object,
    interleave: object,
    rank_stride: object,
    device: torch.device,
) -> tuple[int, int, int, int]:
    """The plain convert's arguments from vLLM's releases (SPEC 10): ``idx_mapping`` int32, 1-D and
    contiguous (vLLM asserts that much; its values are not read on the host), and the DCP layout
    (vLLM checks none of it on this entry point; ours refuses what no layout means), the prefill
    workspace's rank stride None (0, as vLLM launches it) or an int32 >= 0. (D, rank, I, stride)."""
    if idx_mapping is not None:
        m = _require_tensor("idx_mapping", idx_mapping, AssertedDtypeError)
        _require_dtype("idx_mapping", m, (torch.int32,), AssertedDtypeError)
        _require_dim("idx_mapping", m, 1)
        if not m.is_contiguous():
            raise AssertedInputError("wrong_shape", f"idx_mapping.stride()={m.stride()}: must be contiguous")
        if m.device != device:
            raise InvalidInputError(
                "device_mismatch", f"idx_mapping.device={m.device} != token_indices.device={device}"
            )
    d = _require_int("dcp_size", dcp_size, "bad_dcp_size", 1)
    r = _require_int("dcp_rank", dcp_rank, "bad_dcp_rank", 0)
    if r >= d:
        raise InvalidInputError("bad_dcp_rank", f"dcp_rank={r} must be below dcp_size={d}")
    i = _require_int("cp_kv_cache_interleave_size", interleave, "bad_interleave", 1)
    stride = (
        0 if rank_stride is None else _require_int("prefill_workspace_rank_stride", rank_stride, "bad_rank_stride", 0)
    )
    return d, r, i, stride


def check_caller_outputs(out: object, valid_counts_out: object, *, rows: int, cols: int, device: torch.device) -> None:
    """SPEC 9.2: a caller's ``out`` must be int32 [rows, cols] and ``valid_counts_out`` int32
    [rows], on the inputs' device (None: not given). Any strides."""
    for name, t, shape in (("out", out, (rows, cols)), ("valid_counts_out", valid_counts_out, (rows,))):
        if t is None:
            continue
        t = _require_tensor(name, t)
        _require_dtype(name, t, (torch.int32,))
        if tuple(t.shape) != shape:
            raise InvalidInputError("wrong_shape", f"{name}.shape={tuple(t.shape)}, expected {shape}")
        if t.device != device:
            raise InvalidInputError("device_mismatch", f"{name}.device={t.device} != token_indices.device={device}")


def _check_dcp_layout(dcp_size: object, interleave: object, block_size: int) -> int:
    """dcp_size >= 1 and an interleave that divides the block size (vLLM's host checks); the size."""
    d = _require_int("dcp_size", dcp_size, "bad_dcp_size", 1)
    i = _require_int("cp_kv_cache_interleave_size", interleave, "interleave_not_dividing_block", 1)
    if block_size % i:
        raise AssertedInputError(
            "interleave_not_dividing_block", f"block size {block_size} % cp_kv_cache_interleave_size={i} != 0"
        )
    return d


def check_dcp_filter_args(
    req_id: object,
    block_table: object,
    token_indices: object,
    dcp_size: object,
    dcp_rank: object,
    interleave: object,
    BLOCK_SIZE: object,
    NUM_TOPK_TOKENS: object,
    BLOCK_N: object,
    *,
    BLOCK_STRIDE_ROWS: object = None,
) -> None:
    """SPEC 9.4's filter: convert's checks (no prefill workspace; ``BLOCK_STRIDE_ROWS`` as convert's),
    then the DCP layout."""
    check_convert_args(
        req_id, block_table, token_indices, BLOCK_SIZE, NUM_TOPK_TOKENS, BLOCK_N, False, None, None,
        BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
    )  # fmt: skip
    d = _check_dcp_layout(dcp_size, interleave, BLOCK_SIZE)  # type: ignore[arg-type]
    _require_int("dcp_rank", dcp_rank, "bad_dcp_rank", 0, d - 1)


def check_dcp_peer_args(
    req_id: object,
    block_table: object,
    token_indices: object,
    dcp_size: object,
    blocks_per_peer: object,
    interleave: object,
    block_size: object,
    BLOCK_N: object,
    out: object = None,
    valid_counts_out: object = None,
) -> None:
    """SPEC 9.4's peer-slot map: tensors as convert's (any width), the layout, and a peer view of
    ``dcp_size * blocks_per_peer * block_size`` rows whose slots fit int32."""
    tensors = []
    for name, t in (("req_id", req_id), ("block_table", block_table), ("token_indices", token_indices)):
        t = _require_tensor(name, t)
        _require_dtype(name, t, (torch.int32,))
        tensors.append((name, t))
    for (name, t), ndim in zip(tensors, (1, 2, 2)):
        _require_dim(name, t, ndim)
    _require_same_device(tensors)
    ri, ti = tensors[0][1], tensors[2][1]
    bs = _require_int("block_size", block_size, "bad_block_size", 1)
    bn = _require_int("BLOCK_N", BLOCK_N, "bad_block_n", 1)
    if bn & (bn - 1):
        raise InvalidInputError("bad_block_n", f"BLOCK_N={bn} must be a power of two")
    d = _check_dcp_layout(dcp_size, interleave, bs)
    p = _require_int("blocks_per_peer", blocks_per_peer, "bad_blocks_per_peer", 1, 1 << 62)
    if d * p * bs > _INT32_MAX:
        raise InvalidInputError(
            "peer_space_overflow",
            f"dcp_size={d} * blocks_per_peer={p} * block_size={bs} = {d * p * bs} rows: slots past int32",
        )
    if ri.shape[0] != ti.shape[0]:
        raise InvalidInputError(
            "length_mismatch", f"req_id.shape[0]={ri.shape[0]} != token_indices.shape[0]={ti.shape[0]}"
        )
    check_caller_outputs(out, valid_counts_out, rows=ti.shape[0], cols=ti.shape[1], device=ti.device)


def check_gather_args(
    src_cache: object,
    dst: object,
    block_table: object,
    workspace_starts: object,
    batch_size: object,
    seq_starts: object,
    *,
    record_bytes: int = RECORD_BYTES,
) -> None:
    """Shape, dtype and device checks for gather (what vLLM checks, plus dims); ``record_bytes``:
    the cache format's (656 for fp8_ds_mla, 352 for nvfp4_ds_mla's upconvert gather).

    Reads no tensor values; ``check_gather_values`` does the value checks.
    """
    src = _require_tensor("src_cache", src_cache)
    d = _require_tensor("dst", dst)
    bt = _require_tensor("block_table", block_table)
    ws = _require_tensor("workspace_starts", workspace_starts)
    ss = None if seq_starts is None else _require_tensor("seq_starts", seq_starts)
    _require_dtype("src_cache", src, (torch.uint8, torch.float8_e4m3fn))
    _require_dtype("dst", d, (torch.bfloat16,))
    _require_dtype("block_table", bt, (torch.int32,))
    _require_dtype("workspace_starts", ws, (torch.int32,))
    if ss is not None:
        _require_dtype("seq_starts", ss, (torch.int32,))
    b = _require_int("batch_size", batch_size, "wrong_shape", 0)
    _require_dim("src_cache", src, 3)
    _require_dim("dst", d, 2)
    _require_dim("block_table", bt, 2)
    _require_dim("workspace_starts", ws, 1)
    if ss is not None:
        _require_dim("seq_starts", ss, 1)
    _require_same_device(
        [("src_cache", src), ("dst", d), ("block_table", bt), ("workspace_starts", ws), ("seq_starts", ss)]
    )
    if src.shape[-1] != record_bytes:
        raise InvalidInputError("wrong_shape", f"src_cache.shape[-1]={src.shape[-1]} != {record_bytes}")
    if d.shape[1] != ROW_DIM:
        raise InvalidInputError("wrong_shape", f"dst.shape[1]={d.shape[1]} != {ROW_DIM}")
    if ws.shape[0] < b:
        raise InvalidInputError("wrong_shape", f"workspace_starts.shape[0]={ws.shape[0]} < batch_size={b}")
    if bt.shape[0] < b:
        raise InvalidInputError("wrong_shape", f"block_table.shape[0]={bt.shape[0]} < batch_size={b}")
    if ss is not None and ss.shape[0] < b:
        raise InvalidInputError("wrong_shape", f"seq_starts.shape[0]={ss.shape[0]} < batch_size={b}")


def check_gather_values(
    *,
    ws: Sequence[int],
    seq_starts: Sequence[int],
    total: int,
    block_size: int,
    max_blocks: int,
) -> None:
    """The value preconditions of SPEC §4 that vLLM leaves unchecked, except
    the block ids (``check_block_ids``, once the table reads are known safe).

    ``ws`` and ``seq_starts`` hold the first batch_size entries as Python ints
    (the caller pays the device->host copy).
    """
    b = len(ws)
    if b == 0:
        if total > 0:  # rows exist that no request owns
            raise InvalidInputError("ws0_nonzero", f"batch_size=0 with total=dst.shape[0]={total} > 0")
        return
    if ws[0] != 0:
        raise InvalidInputError("ws0_nonzero", f"workspace_starts[0]={ws[0]} != 0")
    for i in range(1, b):
        if ws[i] < ws[i - 1]:
            raise InvalidInputError(
                "ws_decreasing", f"workspace_starts[{i}]={ws[i]} < workspace_starts[{i - 1}]={ws[i - 1]}"
            )
    if ws[b - 1] > total:
        raise InvalidInputError("ws_past_total", f"workspace_starts[{b - 1}]={ws[b - 1]} > total=dst.shape[0]={total}")
    # Only requests with rows read anything, so only they are checked below.
    for i in range(b):
        n = (ws[i + 1] if i + 1 < b else total) - ws[i]
        if n == 0:
            continue
        if seq_starts[i] < 0:
            raise InvalidInputError("negative_seq_start", f"seq_starts[{i}]={seq_starts[i]} < 0 (request length {n})")
        last_blk = (seq_starts[i] + n - 1) // block_size
        if last_blk >= max_blocks:
            raise InvalidInputError(
                "block_index_past_table",
                f"request {i}: (seq_starts[{i}]={seq_starts[i]} + len={n} - 1) // block_size={block_size}"
                f" = {last_blk} >= block_table.shape[1]={max_blocks}",
            )


def check_gather_host_args(
    src_cache: torch.Tensor, host_cache: object, host_row_ids: object, device_row_ids: object
) -> bool:
    """The host tier's arguments (SPEC 9.3): all three or none (returns whether they are given);
    host_cache a CPU uint8 [rows, 656] contiguous tensor; the maps int32, contiguous, of equal
    size, on src_cache's device. No value reads."""
    names = ("host_cache", "host_row_ids", "device_row_ids")
    given = [n for n, x in zip(names, (host_cache, host_row_ids, device_row_ids)) if x is not None]
    if not given:
        return False
    if len(given) != 3:
        raise InvalidInputError(
            "host_args_partial", f"host_cache, host_row_ids and device_row_ids go together; given only {given}"
        )
    hc = _require_tensor("host_cache", host_cache)
    hmap = _require_tensor("host_row_ids", host_row_ids)
    dmap = _require_tensor("device_row_ids", device_row_ids)
    for name, t, dtypes in (
        ("host_cache", hc, (torch.uint8, torch.float8_e4m3fn)),
        ("host_row_ids", hmap, (torch.int32,)),
        ("device_row_ids", dmap, (torch.int32,)),
    ):
        if t.dtype not in dtypes:
            raise InvalidDtypeError("host_wrong_dtype", f"{name}.dtype={t.dtype}, expected {dtypes[0]}")
    if hc.device.type != "cpu":
        raise InvalidInputError("host_wrong_device", f"host_cache.device={hc.device}: the host tier lives on the CPU")
    for name, t in (("host_row_ids", hmap), ("device_row_ids", dmap)):
        if t.device != src_cache.device:
            raise InvalidInputError(
                "host_wrong_device", f"{name}.device={t.device} != src_cache.device={src_cache.device}"
            )
    if hc.dim() != 2 or hc.shape[1] != RECORD_BYTES or not hc.is_contiguous():
        raise InvalidInputError("wrong_shape", f"host_cache.shape={tuple(hc.shape)}: expected contiguous [rows, 656]")
    if hmap.numel() != dmap.numel() or not hmap.is_contiguous() or not dmap.is_contiguous():
        raise InvalidInputError(
            "host_maps_unequal",
            f"host_row_ids.numel()={hmap.numel()}, device_row_ids.numel()={dmap.numel()}: expected equal, contiguous",
        )
    return True


def check_gather_host_rows(
    slots: torch.Tensor, host_row_ids: torch.Tensor, device_row_ids: torch.Tensor, *, host_rows: int, device_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots read (int64) inside the maps, and each one's rows in range; returns (device row,
    host row) per slot, int64. Reads the maps' values (a sync on CUDA)."""
    if slots.numel() and int(slots.max()) >= host_row_ids.numel():
        raise InvalidInputError(
            "slot_past_row_map", f"slot {int(slots.max())} read >= the maps' size {host_row_ids.numel()}"
        )
    d = device_row_ids.reshape(-1)[slots].long()
    h = host_row_ids.reshape(-1)[slots].long()
    if d.numel() and int(d.max()) >= device_rows:
        raise InvalidInputError(
            "device_row_past_cache", f"device row {int(d.max())} >= num_blocks * block_size={device_rows}"
        )
    from_host = h[d < 0]
    if from_host.numel() and (int(from_host.min()) < 0 or int(from_host.max()) >= host_rows):
        bad = int(from_host.min()) if int(from_host.min()) < 0 else int(from_host.max())
        raise InvalidInputError("host_row_past_cache", f"host row {bad} read, not in [0, host_cache rows={host_rows})")
    return d, h


def check_block_ids(used_block_ids: torch.Tensor, num_blocks: int) -> None:
    """Every block id that gather reads from the table must be in [0, num_blocks)."""
    if used_block_ids.numel():
        lo, hi = int(used_block_ids.min()), int(used_block_ids.max())
        if lo < 0 or hi >= num_blocks:
            bad = lo if lo < 0 else hi
            raise InvalidInputError(
                "block_id_past_cache", f"block id {bad} read from block_table not in [0, num_blocks={num_blocks})"
            )


def check_writer_args(
    kv_c: object,
    k_pe: object,
    kv_cache: object,
    slot_mapping: object,
    kv_cache_dtype: object,
    *,
    record_format: str = "fp8_ds_mla",
    record_bytes: int = RECORD_BYTES,
) -> None:
    """Shape, dtype and device checks for a writer of ``record_format`` records of
    ``record_bytes`` bytes (the fp8_ds_mla writer's by default; no value reads)."""
    if kv_cache_dtype != record_format:
        raise InvalidInputError(
            "unsupported_kv_cache_dtype", f"kv_cache_dtype={kv_cache_dtype!r}, only {record_format!r} is implemented"
        )
    kc = _require_tensor("kv_c", kv_c)
    kp = _require_tensor("k_pe", k_pe)
    cache = _require_tensor("kv_cache", kv_cache)
    sm = _require_tensor("slot_mapping", slot_mapping)
    _require_dtype("kv_c", kc, (torch.bfloat16, torch.float16))
    _require_dtype("k_pe", kp, (torch.bfloat16, torch.float16))
    _require_dtype("kv_cache", cache, (torch.uint8, torch.float8_e4m3fn))
    _require_dtype("slot_mapping", sm, (torch.int64, torch.int32))
    _require_dim("kv_c", kc, 2)
    _require_dim("k_pe", kp, 2)
    _require_dim("kv_cache", cache, 3)
    _require_dim("slot_mapping", sm, 1)
    _require_same_device([("kv_c", kc), ("k_pe", kp), ("kv_cache", cache), ("slot_mapping", sm)])
    if kc.shape[1] != NOPE_DIM:
        raise InvalidInputError("wrong_shape", f"kv_c.shape[1]={kc.shape[1]} != {NOPE_DIM}")
    if kp.shape[1] != ROPE_DIM:
        raise InvalidInputError("wrong_shape", f"k_pe.shape[1]={kp.shape[1]} != {ROPE_DIM}")
    if cache.shape[-1] != record_bytes:
        raise InvalidInputError("wrong_shape", f"kv_cache.shape[-1]={cache.shape[-1]} != {record_bytes}")
    if kp.shape[0] != kc.shape[0]:
        raise InvalidInputError("wrong_shape", f"k_pe.shape[0]={kp.shape[0]} != kv_c.shape[0]={kc.shape[0]}")
    if sm.shape[0] > kc.shape[0]:
        # vLLM walks slot_mapping; each entry reads one row of kv_c / k_pe.
        raise InvalidInputError("wrong_shape", f"slot_mapping.shape[0]={sm.shape[0]} > kv_c.shape[0]={kc.shape[0]}")
