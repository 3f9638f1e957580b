"""The plain convert's arguments from vLLM's releases (SPEC 10), drawn and built for the ``convert``
op (generators/ops/convert.py): ``idx_mapping`` (0.33.0) and the DCP arguments (0.30.0). Each is an
optional capability of an implementation (``IDX_MAPPING``, ``DCP_ARGS``: kernels/external.py reads
them off its signature); ``needs`` and ``fit`` keep a case that has them away from one that lacks them.

An ``idx_mapping`` case is the same batch read through a mapping that is not the identity: the
requests' table rows are a permutation of the mapping's entries, some requests read through an
extra entry that repeats another's row or is negative (row 0), and each row's ``req_id`` is the
mapping index that leads to its own table row. So the slots are the batch's own, and an
implementation that ignores the mapping reads another request's row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from mlafuzz.generators.draw import Deployment, Drawer
from mlafuzz.generators.spec import check_int

IDX_MAPPING, DCP_ARGS = "idx_mapping", "dcp_args"  # capability names (kernels/external.py)
DCP_PARAMS = ("dcp_size", "dcp_rank", "cp_kv_cache_interleave_size", "prefill_workspace_rank_stride")


@dataclass(frozen=True, kw_only=True)
class IdxMapping:
    """vLLM 0.33.0's ``idx_mapping``: int32 [num_requests], request r's table row max(m[r], 0)."""

    extra: int = 0  # entries past one per request: repeats of another's row, or negative (row 0)

    def __post_init__(self) -> None:
        check_int("IdxMapping", "extra", self.extra, lo=0, hi=16)


@dataclass(frozen=True, kw_only=True)
class ConvertDcp:
    """vLLM 0.30.0's DCP arguments of the plain convert (SPEC 10): ``size`` ranks, this ``rank``,
    ``interleave`` tokens per rank in turn, the gathered prefill workspace's rows per rank
    (``rank_stride``; None: not passed, which vLLM launches as 0)."""

    size: int = 1
    rank: int = 0
    interleave: int = 1
    rank_stride: int | None = None

    def __post_init__(self) -> None:
        check_int("ConvertDcp", "size", self.size, lo=1, hi=64)
        check_int("ConvertDcp", "rank", self.rank, lo=0, hi=self.size - 1)
        check_int("ConvertDcp", "interleave", self.interleave, lo=1, hi=1 << 12)
        if self.rank_stride is not None:
            check_int("ConvertDcp", "rank_stride", self.rank_stride, lo=0, hi=(1 << 31) - 1)


def draw_idx_mapping(d: Drawer, dep: Deployment) -> IdxMapping | None:
    """A mapping in about a third of the cases (HiSparse's call sites pass one), with extra entries
    half the time."""
    if not dep.boolean("idx_mapping") or d.integer(0, 2):
        return None
    return IdxMapping(extra=d.integer(0, 3) if d.boolean() else 0)


def draw_dcp(d: Drawer, dep: Deployment, *, prefill: bool) -> ConvertDcp | None:
    """The DCP arguments in about half the cases, most of those with prefill rows (the rank stride
    shows only on a prefill row's token of another rank): D in 1 (the defaults spelled out), 2, 3,
    4; a compile-time interleave (vLLM's constexpr) of 1, 2, 4 or 16; a rank stride mostly given."""
    if not dep.boolean("dcp_args") and not (prefill and d.integer(0, 7)):
        return None
    size = dep.choice("dcp_size", (1, 2, 2, 3, 4))
    stride = None if d.integer(0, 7) == 0 else d.choice((0, 1, 64, 4096, 4096, 4096, (1 << 20) + 3))
    return ConvertDcp(
        size=size,
        rank=d.integer(0, size - 1),
        interleave=dep.choice("dcp_interleave", (1, 2, 4, 16)),
        rank_stride=stride,
    )


def mapping_tensors(
    spec: IdxMapping, *, seed: int, owners: torch.Tensor, requests: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx_mapping int32 on ``device``, the rows' ``req_id`` as indices into it). Host numbers from a
    generator of the case's own (the mapping is tiny); the rows' ids are remapped on the device by one
    gather, no sync."""
    rng = np.random.default_rng([int(seed) & ((1 << 63) - 1), 37])
    perm = rng.permutation(requests).astype(np.int64)
    pick = np.empty(max(requests, 1), dtype=np.int64)
    pick[perm] = np.arange(requests)  # request r reads through the entry that holds r
    entries = list(perm)
    for j in range(spec.extra if requests else 0):
        if rng.integers(0, 2):  # a negative entry reads row 0, as entry perm^-1[0] does
            entries.append(-1 - int(rng.integers(0, 3)))
            target = 0
        else:
            target = int(rng.integers(0, requests))
            entries.append(target)
        pick[target] = requests + j  # that request reads through the extra entry now
    mapping = torch.tensor(entries, dtype=torch.int32).to(device)
    req = torch.tensor(pick, dtype=torch.int64).to(device)[owners.long().clamp(0, max(requests - 1, 0))]
    return mapping, req.to(torch.int32)


def release_params(dcp: ConvertDcp | None) -> dict[str, Any]:
    """The case params that pass the DCP arguments (none: not passed)."""
    if dcp is None:
        return {}
    return dict(zip(DCP_PARAMS, (dcp.size, dcp.rank, dcp.interleave, dcp.rank_stride)))


def features(idx: IdxMapping | None, dcp: ConvertDcp | None) -> set[str]:
    out = set()
    if idx is not None:
        out |= {"idx-mapping"} | ({"idx-mapping:extra"} if idx.extra else set())
    if dcp is not None:
        out.add(f"dcp-args:{'d1' if dcp.size == 1 else 'dn'}")
        if dcp.size > 1 and dcp.rank_stride:
            out.add("dcp-args:rank-stride")
    return out


def needs(case: Any) -> frozenset[str]:
    return frozenset({IDX_MAPPING} if case.tensors.get("idx_mapping") is not None else ()) | frozenset(
        {DCP_ARGS} if "dcp_size" in case.params else ()
    )


def fit(spec: Any, capabilities: frozenset[str]) -> dict[str, Any]:
    """The changes that take out of ``spec`` what an implementation with ``capabilities`` lacks."""
    changes: dict[str, Any] = {}
    if spec.idx_mapping is not None and IDX_MAPPING not in capabilities:
        changes["idx_mapping"] = None
    if spec.dcp is not None and DCP_ARGS not in capabilities:
        changes["dcp"] = None
    return changes


def reduce(s: Any) -> Iterator[Any]:
    """Simpler: no mapping, no extra entries; no DCP arguments, one rank, no stride."""
    if s.idx_mapping is not None:
        yield dataclasses.replace(s, idx_mapping=None)
        if s.idx_mapping.extra:
            yield dataclasses.replace(s, idx_mapping=IdxMapping())
    if s.dcp is not None:
        yield dataclasses.replace(s, dcp=None)
        for simpler in (ConvertDcp(), dataclasses.replace(s.dcp, rank_stride=None)):
            if simpler != s.dcp:
                yield dataclasses.replace(s, dcp=simpler)
