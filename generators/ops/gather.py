"""The ``gather`` op's inputs (SPEC.md section 4): spec, drawer, materializer, features, shrink
steps and error-input classes. The op table (harness/ops) wires them to the oracle and the call.
The call itself (its requests, paging, views, ws form: checked, materialized, described and shrunk)
is gather_call.py's, shared with nvfp4_gather; this module adds fp8_ds_mla's records and the host
tier. ``GatherRequest`` lives there and is named here too, as callers name it.

The host tier (SPEC 9.3, vLLM's HiSparse) is an optional capability (``host_tier``): the drawer
draws it in some cases, ``fit`` takes it out for an implementation without it, and ``needs`` says
a case calls for it, so a gather without the three arguments is never called with them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Drawer, Knobs, draw_paging, draw_view, sized, tile_total
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.invalid import InvalidClass, with_
from mlafuzz.generators.ops import gather_call
from mlafuzz.generators.ops.gather_call import GatherRequest
from mlafuzz.generators.rng.hashing import Stream, mix
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.rng.records import paged_cache
from mlafuzz.generators.rng.shuffle import permutation
from mlafuzz.generators.spec import Paging, ValueMode, View, WsForm, check_int
from mlafuzz.oracles.gather import row_records


@dataclass(frozen=True, kw_only=True)
class HostTier:
    """The host tier of a gather call (SPEC 9.3): which source slots are served from pinned host
    memory and how the device rows are laid out. Host and device hold different records, so a
    call that reads the wrong tier shows."""

    host_pct: int = 50  # share of the case's source slots served from the host, in percent
    remap: bool = True  # device rows remapped (device row 0 among them), not the slot itself
    extra_host_blocks: int = 0  # host rows no slot names (a block's worth each)
    maps_2d: bool = False  # the maps shaped [1, n], as vLLM's HiSparse staging plan makes them

    def __post_init__(self) -> None:
        check_int("HostTier", "host_pct", self.host_pct, lo=0, hi=100)
        check_int("HostTier", "extra_host_blocks", self.extra_host_blocks, lo=0, hi=64)


@dataclass(frozen=True, kw_only=True)
class GatherSpec:
    """A gather call (SPEC section 4)."""

    op: ClassVar[str] = "gather"
    requests: tuple[GatherRequest, ...]
    paging: Paging = Paging()
    values: ValueMode = ValueMode.ACTIVATIONS
    ws_form: WsForm = WsForm.EXACT
    pass_seq_starts: bool = True  # False: seq_starts=None (requires every seq_start == 0)
    table_view: View = View.PLAIN  # block_table a column or row slice of a larger table (SPEC 8)
    dst_view: View = View.PLAIN  # ROWS: dst rows of a larger workspace the harness guards (SPEC 8)
    host: HostTier | None = None  # the host tier's arguments (SPEC 9.3), or none of them

    def __post_init__(self) -> None:
        gather_call.check(self, ValueMode)


# --- drawing ---------------------------------------------------------------


def draw(d: Drawer, knobs: Knobs) -> GatherSpec:
    """A chunked-context gather (SPEC 5.2): contexts up to max_seq_len, each request reading one chunk
    of it; the rows read in all (dst) at most max_rows, their blocks at most max_records records."""
    pass_seq_starts = not d.boolean()
    n = sized(d, knobs, 1, knobs.max_requests, tiles=knobs.row_tiles)
    paging = draw_paging(d, knobs)
    bs = paging.block_size
    max_ctx = max(0, min(knobs.max_seq_len, (knobs.max_table // n - paging.extra_table_cols) * bs))
    rows_left = min(knobs.max_rows, max(0, knobs.max_records - n * bs))  # a chunk's blocks: rows / bs + 1
    requests = []
    for _ in range(n):
        ctx = sized(d, knobs, 0, max_ctx)
        start = sized(d, knobs, 0, ctx) if pass_seq_starts else 0
        length = sized(d, knobs, 0, min(ctx - start, rows_left), tiles=knobs.row_tiles)
        rows_left -= length
        requests.append(GatherRequest(context_len=ctx, seq_start=start, length=length))
    total = sum(r.length for r in requests)
    last = requests[-1]
    target = tile_total(
        d, knobs, total, hi=min(knobs.max_rows, total + last.context_len - last.seq_start - last.length)
    )
    if target != total and 0 <= last.length + target - total <= last.context_len - last.seq_start:
        requests[-1] = dataclasses.replace(last, length=last.length + target - total)
    spec = GatherSpec(
        requests=tuple(requests),
        paging=paging,
        values=d.choice(list(ValueMode)),
        ws_form=d.choice(list(WsForm)),
        pass_seq_starts=pass_seq_starts,
        table_view=draw_view(d, knobs, (View.COLUMNS, View.ROWS)),
        dst_view=draw_view(d, knobs, (View.ROWS,)),
    )
    return _draw_host(d, spec)  # drawn last: the fields above keep their draws


def _draw_host(d: Drawer, spec: GatherSpec) -> GatherSpec:
    """A host tier in a third of the cases (``fit`` takes it out for implementations without one; on
    a GPU each costs a host cache's pinning and copies, so a larger share would cost speed); half of those
    called as vLLM's HiSparse prefill calls it, a chunk at a time: a row slice of the table and no
    seq_starts."""
    if d.integer(0, 2) != 2:
        return spec
    host = HostTier(host_pct=d.choice([50, 100, 0, 10, 90]), remap=not d.boolean(), extra_host_blocks=d.integer(0, 2))
    if d.boolean():
        return dataclasses.replace(spec, host=host)
    requests = tuple(dataclasses.replace(r, seq_start=0) for r in spec.requests)
    host = dataclasses.replace(host, maps_2d=True)
    return dataclasses.replace(spec, host=host, requests=requests, pass_seq_starts=False, table_view=View.ROWS)


# --- materializing -----------------------------------------------------------


def materialize(spec: GatherSpec, *, seed: int, device: str) -> Case:
    """The call's tensors on ``device`` (``gather_call.materialize``: fp8_ds_mla records), with the
    host tier's three when the spec has one."""

    def host(draws: Draws, num_blocks: int) -> dict[str, torch.Tensor]:
        return host_tensors(spec, draws.child("host"), num_blocks=num_blocks, device=device)

    return gather_call.materialize(
        spec, seed=seed, device=device, cache=paged_cache, extra=None if spec.host is None else host
    )


def host_tensors(spec: GatherSpec, draws: Draws, *, num_blocks: int, device: str) -> dict[str, torch.Tensor]:
    """The host tier's three tensors (SPEC 9.3), made for every slot of the case's blocks, read or not:
    per slot a hash picks its tier (host_pct). Every generated slot has a host row (distinct, a keyed
    permutation of the host rows: vLLM's host map names a row for device copies too); a device slot
    has a device row, itself or, with ``remap``, another generated row, and 1 slot in 4 row 0 (a
    zero record when the blocks sit above a zero head). A host slot's device map is -1 or, 1 time in 4,
    another negative value (any negative means "host"). The host cache holds other records than the
    device cache (another stream), pinned on a CUDA case as vLLM's pool is. Slots of the zero head
    name no row (-1, -1): no valid call reads them."""
    assert spec.host is not None
    tier = spec.host
    bs, base = spec.paging.block_size, spec.paging.base_block
    first, n_pool = base * bs, (num_blocks - base) * bs
    host_rows = n_pool + tier.extra_host_blocks * bs
    key = Stream(draws.seed, f"{draws.name}/tier")
    idx = torch.arange(n_pool, dtype=torch.int64, device=device)
    word = mix(idx, k0=key.k0, k1=key.k1)
    on_host = (word % 100) < tier.host_pct
    # Whole orders with no host sync (a walked permutation synced twenty-odd times a case).
    host_rows_of = permutation(draws.perm(host_rows), device=device)[:n_pool] if n_pool else idx
    if tier.remap and n_pool:
        dev_rows = first + permutation(draws.child("device").perm(n_pool), device=device)
        dev_rows = torch.where(((word >> 8) & 3) == 0, 0, dev_rows)
    else:
        dev_rows = first + idx
    negative = torch.where(((word >> 12) & 3) == 0, -1 - ((word >> 14) & 0x3FFFFFFF), -1)
    hmap = torch.full((num_blocks * bs,), -1, dtype=torch.int32, device=device)
    dmap = torch.full((num_blocks * bs,), -1, dtype=torch.int32, device=device)
    hmap[first:] = host_rows_of.to(torch.int32)
    dmap[first:] = torch.where(on_host, negative, dev_rows).to(torch.int32)
    host_blocks = -(-host_rows // bs) if host_rows else 0
    records = paged_cache(draws.child("records"), spec.values, pool_blocks=host_blocks, block_size=bs, device=device)
    host = records.view(-1, records.shape[-1])[:host_rows]
    if str(device).startswith("cuda"):
        # Straight into pinned memory: `.cpu().pin_memory()` copied the whole host cache twice on
        # the host (up to hundreds of MB a case at --size large).
        host = torch.empty(host.shape, dtype=host.dtype, pin_memory=True).copy_(host)
    if tier.maps_2d:
        hmap, dmap = hmap.view(1, -1), dmap.view(1, -1)
    return {"host_cache": host, "host_row_ids": hmap, "device_row_ids": dmap}


# --- features, size, shrinking -------------------------------------------------


def features(spec: GatherSpec) -> set[str]:
    out = gather_call.features(spec)
    if spec.host is not None:
        out.add(f"host:{'all' if spec.host.host_pct == 100 else 'none' if spec.host.host_pct == 0 else 'mixed'}")
        if spec.host.remap:
            out.add("host:remap")
        if not spec.pass_seq_starts and spec.table_view is View.ROWS:
            out.add("host:chunk-call")
        if spec.host.maps_2d:
            out.add("host:maps-2d")
    return out


def reduce(s: GatherSpec) -> Iterator[GatherSpec]:
    yield from gather_call.reduce(s)
    if s.host is not None:
        yield dataclasses.replace(s, host=None)
        if s.host.remap:
            yield dataclasses.replace(s, host=dataclasses.replace(s.host, remap=False))
        if s.host.maps_2d:
            yield dataclasses.replace(s, host=dataclasses.replace(s.host, maps_2d=False))
        if s.host.extra_host_blocks:
            yield dataclasses.replace(s, host=dataclasses.replace(s.host, extra_host_blocks=0))


HOST_TIER = "host_tier"  # the capability's name (kernels/external.py detects it from a signature)
HOST_ARGS = ("host_cache", "host_row_ids", "device_row_ids")


def needs(case: Case) -> frozenset[str]:
    """Optional implementation capabilities this case calls for (non-zero seq_starts, the host tier)."""
    out = set(gather_call.needs(case))
    if any(case.tensors.get(k) is not None for k in HOST_ARGS):
        out.add(HOST_TIER)
    return frozenset(out)


def fit(spec: GatherSpec, capabilities: frozenset[str]) -> GatherSpec:
    """``spec`` without the host tier for an implementation without it."""
    return dataclasses.replace(spec, host=None) if spec.host is not None and HOST_TIER not in capabilities else spec


# --- error inputs (SPEC section 4: preconditions and host-side checks) ---


def _gather_wrong_dtype(case: Case) -> Case | None:
    return with_(case, params={"dst_dtype": "float32"})


def _gather_wrong_shape(case: Case) -> Case | None:
    return with_(case, params={"dst_cols": 575})


def _device_mismatch(case: Case) -> Case | None:
    if not case.device.startswith("cuda"):
        return None
    return with_(case, tensors={"block_table": case.tensors["block_table"].cpu()})


def _ws(case: Case) -> torch.Tensor:
    return case.tensors["workspace_starts"]


def _ws0_nonzero(case: Case) -> Case | None:
    return with_(case, tensors={"workspace_starts": _ws(case) + 1}, params={"total": case.params["total"] + 1})


def _ws_decreasing(case: Case) -> Case | None:
    b = case.params["batch_size"]
    if b < 3:  # ws[0] must stay 0, so a drop needs ws[1] > ws[2]
        return None
    ws = _ws(case).clone()
    ws[1] = ws[b - 1] + 1
    return with_(case, tensors={"workspace_starts": ws}, params={"total": max(case.params["total"], int(ws[1]))})


def _ws_past_total(case: Case) -> Case | None:
    b = case.params["batch_size"]
    ws = _ws(case).clone()
    ws[b - 1] = case.params["total"] + 1  # dst too small for where the last request starts
    ws[:b] = torch.cummax(ws[:b], 0).values
    return with_(case, tensors={"workspace_starts": ws})


def _block_index_past_table(case: Case) -> Case | None:
    starts = case.tensors["seq_starts"]
    if starts is None or case.params["total"] == 0:
        return None
    width = case.tensors["block_table"].shape[1]
    bs = case.tensors["src_cache"].shape[1]
    return with_(case, tensors={"seq_starts": starts + width * bs})


def _block_id_past_cache(case: Case) -> Case | None:
    if case.params["total"] == 0:
        return None
    table = case.tensors["block_table"].clone()
    table.fill_(case.tensors["src_cache"].shape[0] + 7)
    return with_(case, tensors={"block_table": table})


def _negative_seq_start(case: Case) -> Case | None:
    starts = case.tensors["seq_starts"]
    if starts is None or case.params["total"] == 0:
        return None
    return with_(case, tensors={"seq_starts": starts - (starts.max() + 1)})


# --- error inputs of the host tier (SPEC 9.3) ---


def _host(case: Case) -> bool:
    return case.tensors.get("host_cache") is not None


def _host_args_partial(case: Case) -> Case | None:
    return with_(case, tensors={"device_row_ids": None}) if _host(case) else None


def _host_wrong_dtype(case: Case) -> Case | None:
    return with_(case, tensors={"host_row_ids": case.tensors["host_row_ids"].to(torch.int64)}) if _host(case) else None


def _host_wrong_device(case: Case) -> Case | None:
    if not _host(case) or not case.device.startswith("cuda"):
        return None  # on a CPU case every tensor is where it belongs
    return with_(case, tensors={"device_row_ids": case.tensors["device_row_ids"].cpu()})


def _flat(case: Case, name: str) -> torch.Tensor:
    """A map as a fresh 1-D copy (vLLM's maps may be [1, n])."""
    return case.tensors[name].reshape(-1).clone()


def _host_maps_unequal(case: Case) -> Case | None:
    if not _host(case) or case.tensors["device_row_ids"].numel() == 0:
        return None
    return with_(case, tensors={"device_row_ids": _flat(case, "device_row_ids")[:-1]})


def _read_slots(case: Case) -> torch.Tensor:
    t, bs = case.tensors, case.tensors["src_cache"].shape[1]
    block, entry = row_records(
        block_size=bs,
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
        total=case.params["total"],
        device=torch.device(case.device),
    )
    return block * bs + entry


def _slot_past_row_map(case: Case) -> Case | None:
    if not _host(case) or case.params["total"] == 0:
        return None
    n = int(_read_slots(case).max())  # both maps end just before the largest slot read
    return with_(case, tensors={k: _flat(case, k)[:n] for k in ("host_row_ids", "device_row_ids")})


def _on_host(case: Case) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(slots read, which of them the host serves), or None without a host tier or rows."""
    if not _host(case) or case.params["total"] == 0:
        return None
    slots = _read_slots(case)
    return slots, case.tensors["device_row_ids"].reshape(-1).long()[slots] < 0


def _host_row_past_cache(case: Case) -> Case | None:
    got = _on_host(case)
    if got is None or not bool(got[1].any()):
        return None
    hmap = _flat(case, "host_row_ids")
    hmap[got[0][got[1]]] = case.tensors["host_cache"].shape[0]  # one past the last host row
    return with_(case, tensors={"host_row_ids": hmap.view(case.tensors["host_row_ids"].shape)})


def _device_row_past_cache(case: Case) -> Case | None:
    got = _on_host(case)
    if got is None or bool(got[1].all()):
        return None
    cache = case.tensors["src_cache"]
    dmap = _flat(case, "device_row_ids")
    dmap[got[0][~got[1]]] = cache.shape[0] * cache.shape[1]
    return with_(case, tensors={"device_row_ids": dmap.view(case.tensors["device_row_ids"].shape)})


# The four classes of the host arguments themselves. The value preconditions (slot_past_row_map,
# host_row_past_cache, device_row_past_cache: ``HOST_VALUE_INVALID``) are kept out of the fuzz loop's
# rotation, which turns through an op's classes in order: more classes, fewer turns each; a run
# whose --contract names one takes it into its rotation (the generator's ``promisable``).
HOST_INVALID: tuple[InvalidClass, ...] = (
    InvalidClass(
        name="host_args_partial",
        memory_safe=True,
        make=_host_args_partial,
        description="host_cache and host_row_ids given, device_row_ids not",
    ),
    InvalidClass(
        name="host_wrong_dtype", memory_safe=False, make=_host_wrong_dtype, description="host_row_ids int64, not int32"
    ),
    InvalidClass(
        name="host_wrong_device",
        memory_safe=False,
        make=_host_wrong_device,
        description="device_row_ids on the CPU, the rest of the call on the GPU",
    ),
    InvalidClass(
        name="host_maps_unequal",
        memory_safe=False,
        make=_host_maps_unequal,
        description="device_row_ids one entry shorter than host_row_ids",
    ),
)


INVALID: tuple[InvalidClass, ...] = (
    InvalidClass(
        name="wrong_dtype", memory_safe=True, make=_gather_wrong_dtype, description="dst is float32, not bf16"
    ),
    InvalidClass(
        name="wrong_shape", memory_safe=False, make=_gather_wrong_shape, description="dst has 575 columns, not 576"
    ),
    InvalidClass(
        name="device_mismatch",
        memory_safe=False,
        make=_device_mismatch,
        description="block_table on the CPU, the rest on the GPU",
    ),
    InvalidClass(name="ws0_nonzero", memory_safe=True, make=_ws0_nonzero, description="workspace_starts[0] != 0"),
    InvalidClass(
        name="ws_decreasing", memory_safe=False, make=_ws_decreasing, description="workspace_starts decreases"
    ),
    InvalidClass(
        name="ws_past_total",
        memory_safe=False,
        make=_ws_past_total,
        description="workspace_starts[B-1] > dst rows (dst too small)",
    ),
    InvalidClass(
        name="block_index_past_table",
        memory_safe=False,
        make=_block_index_past_table,
        description="(seq_start + len - 1) // bs >= block table width",
    ),
    InvalidClass(
        name="block_id_past_cache", memory_safe=False, make=_block_id_past_cache, description="a block id >= num_blocks"
    ),
    InvalidClass(
        name="negative_seq_start", memory_safe=False, make=_negative_seq_start, description="a negative seq_start"
    ),
) + HOST_INVALID

HOST_VALUE_INVALID: tuple[InvalidClass, ...] = (
    InvalidClass(
        name="slot_past_row_map",
        memory_safe=False,
        make=_slot_past_row_map,
        description="both maps end before the largest source slot read",
    ),
    InvalidClass(
        name="host_row_past_cache",
        memory_safe=False,
        make=_host_row_past_cache,
        description="a host-served slot names host row = host_cache rows",
    ),
    InvalidClass(
        name="device_row_past_cache",
        memory_safe=False,
        make=_device_row_past_cache,
        description="a device-served slot names device row = num_blocks * block_size",
    ),
)


GENERATOR = Generator(
    spec_type=GatherSpec,
    draw=draw,
    materialize=materialize,
    features=features,
    size=gather_call.size,
    reduce=reduce,
    invalid=INVALID,
    promisable=HOST_VALUE_INVALID,
)
