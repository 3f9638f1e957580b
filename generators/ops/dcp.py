"""The DCP ops' inputs (SPEC.md section 9.4): ``dcp`` (vLLM's ``triton_filter_and_convert_dcp_index``)
and ``dcp_peer`` (vLLM's ``convert_global_indices_to_dcp_peer_slots``).

Two op rows, not options of ``convert``: vLLM's two functions have signatures of their own (the
rank arguments by position after ``token_indices``, no prefill workspace; the peer variant
without NUM_TOPK_TOKENS and with ``block_size`` in lower case), so neither takes convert's call,
and an implementation must plug in unchanged. Their batches are convert's: a spec holds a
``ConvertSpec`` (``batch``) for the rows, the table and the top-k, built by convert's
materializer, and adds the DCP numbers. The block table is the rank's own: its first
``ceil(M / D)`` columns (a column slice, SPEC 8), so local indices run past it too.

D is drawn from 1 (a quarter of the cases): vLLM's filter hands D = 1 to the plain convert
(oracles/dcp.py ``filter_compacts``). The filter's ``BLOCK_STRIDE_ROWS`` (vLLM 0.29.0) is the
batch's convert option, an optional capability as it is for convert (``needs``, ``fit``); the peer
variant has none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Mapping

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Drawer, Knobs
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.invalid import InvalidClass, with_
from mlafuzz.generators.ops import convert as cv
from mlafuzz.generators.spec import check_int, fail

INT32_MAX = (1 << 31) - 1


def _check_dcp(name: str, batch: cv.ConvertSpec, dcp_size: int, interleave: int, *, stride: bool = False) -> None:
    check_int(name, "dcp_size", dcp_size, lo=1, hi=64)
    check_int(name, "interleave", interleave, lo=1, hi=1 << 12)
    bs = batch.paging.block_size
    if bs % interleave:
        fail(name, "interleave", interleave, f"must divide the block size {bs} (vLLM's host check)")
    kept = batch.block_stride_rows if stride else None  # the filter's BLOCK_STRIDE_ROWS; the peer map has none
    plain = dataclasses.replace(batch, prefill_workspace=False, block_stride_rows=kept, compact=False, caller_out=None)
    if batch != plain or any(r.prefill for r in batch.requests):
        what = "prefill, compaction, out" if stride else "prefill, stride, compaction, out"
        fail(name, "batch", "convert options", f"must be a plain decode batch (no {what})")


@dataclass(frozen=True, kw_only=True)
class DcpSpec:
    """A ``triton_filter_and_convert_dcp_index`` call seen from rank ``dcp_rank``."""

    op: ClassVar[str] = "dcp"
    batch: cv.ConvertSpec
    dcp_size: int = 2
    dcp_rank: int = 0
    interleave: int = 1  # cp_kv_cache_interleave_size
    compact: bool = True  # compact_valid_to_front (vLLM's default)

    def __post_init__(self) -> None:
        _check_dcp("DcpSpec", self.batch, self.dcp_size, self.interleave, stride=True)
        check_int("DcpSpec", "dcp_rank", self.dcp_rank, lo=0, hi=self.dcp_size - 1)


@dataclass(frozen=True, kw_only=True)
class DcpPeerSpec:
    """A ``convert_global_indices_to_dcp_peer_slots`` call."""

    op: ClassVar[str] = "dcp_peer"
    batch: cv.ConvertSpec
    dcp_size: int = 2
    interleave: int = 1
    block_n: int = 64  # BLOCK_N: a power of two; the top-k width need not be a multiple of it
    cut: bool = False  # blocks_per_peer at half the largest block id + 1: larger ids are invalid
    caller_out: cv.CallerOut | None = None  # SPEC 9.2's out= / valid_counts_out=

    def __post_init__(self) -> None:
        _check_dcp("DcpPeerSpec", self.batch, self.dcp_size, self.interleave)
        check_int("DcpPeerSpec", "block_n", self.block_n, lo=1, hi=1 << 12)
        if self.block_n & (self.block_n - 1):
            fail("DcpPeerSpec", "block_n", self.block_n, "must be a power of two")


# --- drawing ---------------------------------------------------------------


def _batch(d: Drawer, knobs: Knobs, *, low_blocks: bool, stride: bool = False) -> cv.ConvertSpec:
    """Convert's draw as a plain decode batch; ``stride``: its BLOCK_STRIDE_ROWS kept (the filter's)."""
    b = cv.draw(d, knobs)
    paging = dataclasses.replace(b.paging, base_block=0) if low_blocks else b.paging
    return dataclasses.replace(
        b,
        requests=tuple(dataclasses.replace(r, prefill=False) for r in b.requests),
        paging=paging,
        prefill_workspace=False,
        block_stride_rows=b.block_stride_rows if stride else None,
        compact=False,
        caller_out=None,
        # The plain convert's release arguments (SPEC 10) are no argument of the DCP filter or the
        # peer map: with an idx_mapping the batch's req_id would index a mapping they never get.
        idx_mapping=None,
        dcp=None,
    )


def _interleave(d: Drawer, block_size: int) -> int:
    """A power of two dividing the block size (vLLM's configs: 1 and the block size, mostly)."""
    options = [i for i in (1, 2, 4, 8, 16, 32, 64) if block_size % i == 0]
    return d.choice(options)


def draw(d: Drawer, knobs: Knobs) -> DcpSpec:
    batch = _batch(d, knobs, low_blocks=False, stride=True)
    # D == 1 a quarter of the time: vLLM's function hands it to the plain convert, its own rules.
    size = 1 if d.integer(0, 3) == 0 else d.integer(2, 8)
    return DcpSpec(
        batch=batch,
        dcp_size=size,
        dcp_rank=d.integer(0, size - 1),
        interleave=_interleave(d, batch.paging.block_size),
        compact=d.integer(0, 3) != 0,
    )


def draw_peer(d: Drawer, knobs: Knobs) -> DcpPeerSpec:
    # Block ids from 0: a peer view of D ranks' caches must fit int32 slots (the host check).
    batch = _batch(d, knobs, low_blocks=True)
    return DcpPeerSpec(
        batch=batch,
        dcp_size=d.integer(1, 8),
        interleave=_interleave(d, batch.paging.block_size),
        block_n=d.choice((16, 32, 64, 128)),
        cut=d.boolean(),
        caller_out=cv.draw_caller_out(d),
    )


# --- materializing -----------------------------------------------------------


def _base(spec: DcpSpec | DcpPeerSpec, *, seed: int, device: str) -> Case:
    case = cv.materialize(spec.batch, seed=seed, device=device)
    table = case.tensors["block_table"]
    local_cols = -(-table.shape[1] // spec.dcp_size)  # this rank's share of the columns
    tensors = {
        "req_id": case.tensors["req_id"],
        "block_table": table[:, :local_cols],
        "token_indices": case.tensors["token_indices"],
    }
    return dataclasses.replace(case, op=spec.op, spec=spec, tensors=tensors)


def materialize(spec: DcpSpec, *, seed: int, device: str) -> Case:
    case = _base(spec, seed=seed, device=device)
    b = spec.batch
    params = {
        "dcp_size": spec.dcp_size,
        "dcp_rank": spec.dcp_rank,
        "cp_kv_cache_interleave_size": spec.interleave,
        "BLOCK_SIZE": b.paging.block_size,
        "NUM_TOPK_TOKENS": b.topk,
        "BLOCK_N": b.block_n,
        "return_valid_counts": b.return_valid_counts,
        "compact_valid_to_front": spec.compact,
    }
    if b.block_stride_rows is not None:
        params["BLOCK_STRIDE_ROWS"] = b.block_stride_rows
    return dataclasses.replace(case, params=params)


def materialize_peer(spec: DcpPeerSpec, *, seed: int, device: str) -> Case:
    case = _base(spec, seed=seed, device=device)
    table = case.tensors["block_table"]
    if spec.cut:  # one host read (a sync on a GPU): this rank's largest id + 1, then its half
        top = int(table.max()) + 1 if table.numel() else 1
        blocks_per_peer = max(1, (top + 1) // 2)
    else:  # every id is below the pool's top, known on the host: no read, and every id valid
        blocks_per_peer = spec.batch.paging.base_block + cv.table_plan(spec.batch).pool
    params = {
        "dcp_size": spec.dcp_size,
        "blocks_per_peer": blocks_per_peer,
        "cp_kv_cache_interleave_size": spec.interleave,
        "block_size": spec.batch.paging.block_size,
        "BLOCK_N": spec.block_n,
        "return_valid_counts": spec.batch.return_valid_counts,
        **cv.caller_out_params(spec.caller_out),
    }
    tensors = dict(case.tensors)
    if spec.caller_out is not None and spec.caller_out.steps == 2:
        # Reversed columns, as convert's step before: the peer map does not compact, so they differ.
        tensors["prev_token_indices"] = tensors["token_indices"].flip(1).contiguous()
    return dataclasses.replace(case, params=params, tensors=tensors)


# --- features, size, shrinking, capabilities ----------------------------------


def features(spec: DcpSpec) -> set[str]:
    out = cv.features(spec.batch) | {f"dcp:D{spec.dcp_size}", f"dcp:I{'1' if spec.interleave == 1 else 'n'}"}
    return out | ({"compact"} if spec.compact else set())


def features_peer(spec: DcpPeerSpec) -> set[str]:
    out = cv.features(spec.batch) | {f"dcp:D{spec.dcp_size}", f"dcp:I{'1' if spec.interleave == 1 else 'n'}"}
    out |= {"peer:cut"} if spec.cut else set()
    out |= {"peer:ragged-tile"} if spec.batch.topk % spec.block_n else set()
    return out | cv.caller_out_features(spec.caller_out)


def size(spec: DcpSpec | DcpPeerSpec) -> dict[str, int]:
    return cv.size(spec.batch)


def _batch_steps(s: DcpSpec | DcpPeerSpec) -> Iterator[DcpSpec | DcpPeerSpec]:
    for b in cv.reduce(s.batch):
        if b.paging.block_size % s.interleave == 0 and b.prefill_workspace is False:
            yield dataclasses.replace(s, batch=b)


def reduce(s: DcpSpec) -> Iterator[DcpSpec]:
    yield from _batch_steps(s)
    if s.dcp_rank:
        yield dataclasses.replace(s, dcp_rank=0)
    if s.interleave > 1:
        yield dataclasses.replace(s, interleave=1)
    if s.compact:
        yield dataclasses.replace(s, compact=False)


def reduce_peer(s: DcpPeerSpec) -> Iterator[DcpPeerSpec]:
    yield from _batch_steps(s)
    yield from cv.caller_out_steps(s)
    if s.cut:
        yield dataclasses.replace(s, cut=False)
    if s.interleave > 1:
        yield dataclasses.replace(s, interleave=1)
    if s.dcp_size > 1:
        yield dataclasses.replace(s, dcp_size=1)


def needs(case: Case) -> frozenset[str]:
    return frozenset({cv.STRIDE} if "BLOCK_STRIDE_ROWS" in case.params else ())


def fit(spec: DcpSpec, capabilities: frozenset[str]) -> DcpSpec:
    if spec.batch.block_stride_rows is not None and cv.STRIDE not in capabilities:
        return dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, block_stride_rows=None))
    return spec


def needs_peer(case: Case) -> frozenset[str]:
    return frozenset({cv.CALLER_OUT} if "out_steps" in case.params else ())


def fit_peer(spec: DcpPeerSpec, capabilities: frozenset[str]) -> DcpPeerSpec:
    if spec.caller_out is not None and cv.CALLER_OUT not in capabilities:
        return dataclasses.replace(spec, caller_out=None)
    return spec


# --- error inputs: what vLLM checks on the host (SPEC 9.4) -------------------------


def _param(name: str, value: Callable[[Mapping[str, Any]], int]) -> Callable[[Case], Case | None]:
    """An error input that sets one scalar argument from the case's params."""
    return lambda case: with_(case, params={name: value(case.params)})


def _peer_overflow(case: Case) -> Case | None:
    p = case.params
    return with_(case, params={"blocks_per_peer": INT32_MAX // (p["dcp_size"] * p["block_size"]) + 1})


def _classes(bs_key: str) -> tuple[InvalidClass, ...]:
    """The classes both variants share; ``bs_key``: the block size's keyword in the call."""
    return (
        InvalidClass(
            name="length_mismatch",
            memory_safe=False,
            make=cv._length_mismatch,
            description="req_id has more rows than token_indices (not checked by vLLM)",
        ),
        InvalidClass(name="wrong_dtype", memory_safe=True, make=cv._convert_wrong_dtype, description="req_id is int64"),
        InvalidClass(
            name="bad_dcp_size",
            memory_safe=True,
            make=_param("dcp_size", lambda p: 0),
            description="dcp_size == 0",
        ),
        InvalidClass(
            name="interleave_not_dividing_block",
            memory_safe=True,
            make=_param("cp_kv_cache_interleave_size", lambda p: p[bs_key] + 1),
            description="the block size is not a multiple of cp_kv_cache_interleave_size",
        ),
    )


INVALID: tuple[InvalidClass, ...] = _classes("BLOCK_SIZE") + (
    InvalidClass(
        name="bad_dcp_rank",
        memory_safe=True,
        make=_param("dcp_rank", lambda p: p["dcp_size"]),
        description="dcp_rank == dcp_size",
    ),
    InvalidClass(name="k_mismatch", memory_safe=True, make=cv._k_mismatch, description="NUM_TOPK_TOKENS != K"),
    InvalidClass(
        name="k_not_multiple_of_block_n",
        memory_safe=False,
        make=cv._k_not_multiple,
        description="NUM_TOPK_TOKENS is not a multiple of BLOCK_N",
    ),
)

INVALID_PEER: tuple[InvalidClass, ...] = _classes("block_size") + (
    InvalidClass(
        name="bad_blocks_per_peer",
        memory_safe=True,
        make=_param("blocks_per_peer", lambda p: 0),
        description="blocks_per_peer == 0",
    ),
    InvalidClass(
        name="bad_block_n",
        memory_safe=False,
        make=_param("BLOCK_N", lambda p: 3),
        description="BLOCK_N is not a power of two",
    ),
    InvalidClass(
        name="peer_space_overflow",
        memory_safe=False,
        make=_peer_overflow,
        description="dcp_size * blocks_per_peer * block_size does not fit int32 (slots would wrap)",
    ),
)


GENERATOR = Generator(
    spec_type=DcpSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=size,
    reduce=reduce,
    invalid=INVALID,
)
GENERATOR_PEER = Generator(
    spec_type=DcpPeerSpec,
    draw=draw_peer,
    materialize=materialize_peer,
    features=features_peer,
    size=size,
    reduce=reduce_peer,
    invalid=INVALID_PEER,
)
