"""materialize(spec, seed, device) -> Case: every tensor from one local generator.

All randomness comes from a CPU ``torch.Generator`` seeded with ``seed`` and the
tensors are built on the CPU first, then moved: the same (spec, seed) gives the
same bytes on every machine and device. The global RNG is never touched.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from mlafuzz.generators import catalog
from mlafuzz.generators.case import Case
from mlafuzz.generators.spec import (
    ConvertSpec, GatherSpec, Layout, Paging, TopkMode, ValueMode, WsForm,
)
from mlafuzz.oracles.codec import encode_rows

RECORD_BYTES = 656

MATERIALIZERS: dict[type, Callable[..., Case]] = {}


def materializer(spec_type: type) -> Callable[[Callable[..., Case]], Callable[..., Case]]:
    def register(fn: Callable[..., Case]) -> Callable[..., Case]:
        MATERIALIZERS[spec_type] = fn
        return fn
    return register


def materialize(spec: Any, seed: int, device: str | torch.device = "cpu") -> Case:
    """Build the case for ``spec`` from ``seed`` on ``device``."""
    try:
        build = MATERIALIZERS[type(spec)]
    except KeyError:
        raise TypeError(f"spec={type(spec).__name__} has no materializer") from None
    gen = torch.Generator(device="cpu").manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    case = build(spec, gen)
    dev = torch.device(device)
    tensors = {k: (v.to(dev) if v is not None else None) for k, v in case.tensors.items()}
    return Case(op=case.op, spec=spec, seed=int(seed), device=str(dev), tensors=tensors, params=case.params)


def _randint(gen: torch.Generator, lo: int, hi: int, size: tuple[int, ...] = ()) -> torch.Tensor:
    """Uniform ints in [lo, hi) (hi > lo)."""
    return torch.randint(lo, hi, size, generator=gen, dtype=torch.int64)


def _pick(gen: torch.Generator, values: tuple[Any, ...]) -> Any:
    return values[int(_randint(gen, 0, len(values)))]


# --- paging ----------------------------------------------------------------

def build_block_table(*, paging: Paging, seq_lens: list[int], gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """Block table int32 [R, M] and pool size for requests of these lengths.

    Entries past a request's last block are 0, as in vLLM's tests (SPEC: unspecified).
    """
    bs = paging.block_size
    need = [-(-n // bs) for n in seq_lens]
    shared = 0
    if paging.layout is Layout.SHARED_PREFIX and need and min(need) > 0 and len(need) > 1:
        shared = max(1, min(need) // 2)
    pool = shared + sum(n - shared for n in need) + paging.spare_blocks
    pool = max(pool, 1)
    if paging.layout is Layout.CONTIGUOUS:
        ids = torch.arange(pool, dtype=torch.int64)
    else:
        ids = torch.randperm(pool, generator=gen)
    width = max(max(need, default=0) + paging.extra_table_cols, 1)
    table = torch.zeros((len(need), width), dtype=torch.int32)
    prefix = ids[:shared]
    cursor = shared
    for r, n in enumerate(need):
        own = ids[cursor:cursor + n - shared]
        cursor += n - shared
        table[r, :n] = torch.cat([prefix, own])[:n].to(torch.int32)
    return table, pool


# --- cache records ---------------------------------------------------------

def _records_from_parts(codes: torch.Tensor, scales: torch.Tensor, rope_bits: torch.Tensor) -> torch.Tensor:
    n = codes.shape[0]
    return torch.cat([
        codes.to(torch.uint8),
        scales.to(torch.float32).contiguous().view(torch.uint8).reshape(n, 16),
        rope_bits.to(torch.int16).contiguous().view(torch.uint8).reshape(n, 128),
    ], dim=1)


def _finite_rope_bits(gen: torch.Generator, n: int) -> torch.Tensor:
    return torch.randn((n, 64), generator=gen).to(torch.bfloat16).view(torch.int16)


def _table_lookup(values: tuple[float, ...], gen: torch.Generator, size: tuple[int, ...]) -> torch.Tensor:
    table = torch.tensor(values, dtype=torch.float32)
    return table[_randint(gen, 0, len(values), size)]


def _activations(gen: torch.Generator, n: int) -> torch.Tensor:
    """Writer output for activations with magnitudes spread over 2^-20..2^20 per tile."""
    mag = torch.exp2(_randint(gen, -20, 21, (n, 4, 1)).float())
    kv_c = (torch.randn((n, 4, 128), generator=gen) * mag).reshape(n, 512)
    zero_tiles = _randint(gen, 0, 16, (n, 4, 1)) == 0  # an all-zero tile gives scale FLT_MIN
    kv_c = kv_c.reshape(n, 4, 128).masked_fill(zero_tiles, 0.0).reshape(n, 512)
    k_pe = torch.randn((n, 64), generator=gen)
    # 2026-07 records on purpose: their arbitrary (non-power-of-two) scales make
    # the gather's f32 multiply round, which power-of-two scales never do.
    return encode_rows(kv_c=kv_c.to(torch.bfloat16), k_pe=k_pe.to(torch.bfloat16), revision="2026-07")


def _all_codes(gen: torch.Generator, n: int) -> torch.Tensor:
    # Every code appears: a fresh permutation of 0..255 for each run of 256 elements
    # (argsort of random keys: one vectorized call however large the cache).
    groups = -(-(n * 512) // 256)
    perms = torch.rand((groups, 256), generator=gen).argsort(dim=1)
    codes = perms.reshape(-1)[:n * 512].reshape(n, 512)
    scales = torch.exp2(torch.randn((n, 4), generator=gen) * 8)
    return _records_from_parts(codes, scales, _finite_rope_bits(gen, n))


def _extreme_scales(gen: torch.Generator, n: int) -> torch.Tensor:
    codes = _randint(gen, 0, 256, (n, 512))
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)  # no NaN codes here
    return _records_from_parts(codes, _table_lookup(catalog.EXTREME_SCALES, gen, (n, 4)), _finite_rope_bits(gen, n))


def _subnormal(gen: torch.Generator, n: int) -> torch.Tensor:
    codes = _randint(gen, 0, 256, (n, 512))
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    return _records_from_parts(codes, _table_lookup(catalog.SUBNORMAL_SCALES, gen, (n, 4)), _finite_rope_bits(gen, n))


def _nan(gen: torch.Generator, n: int) -> torch.Tensor:
    codes = _randint(gen, 0, 256, (n, 512))
    nan_at = _randint(gen, 0, 8, (n, 512)) == 0
    codes = torch.where(nan_at, torch.tensor(catalog.NAN_FP8_CODES)[_randint(gen, 0, 2, (n, 512))], codes)
    scales = torch.exp2(torch.randn((n, 4), generator=gen) * 4)
    bad = _randint(gen, 0, 6, (n, 4)) == 0
    scales = torch.where(bad, _table_lookup(catalog.NONFINITE_SCALES, gen, (n, 4)), scales)
    rope = _finite_rope_bits(gen, n)
    special = torch.tensor(catalog.ROPE_SPECIAL_BITS, dtype=torch.int32).to(torch.int16)
    rope_at = _randint(gen, 0, 6, (n, 64)) == 0
    rope = torch.where(rope_at, special[_randint(gen, 0, len(special), (n, 64))], rope)
    return _records_from_parts(codes, scales, rope)


RECORD_MAKERS: dict[ValueMode, Callable[[torch.Generator, int], torch.Tensor]] = {
    ValueMode.ACTIVATIONS: _activations,
    ValueMode.ALL_CODES: _all_codes,
    ValueMode.EXTREME_SCALES: _extreme_scales,
    ValueMode.SUBNORMAL: _subnormal,
    ValueMode.NAN: _nan,
}


def make_records(*, mode: ValueMode, n: int, gen: torch.Generator) -> torch.Tensor:
    """n fp8_ds_mla records, uint8 [n, 656], of the given value mode."""
    return RECORD_MAKERS[mode](gen, n)


def make_cache(*, mode: ValueMode, num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    return make_records(mode=mode, n=num_blocks * block_size, gen=gen).reshape(num_blocks, block_size, RECORD_BYTES)


# --- convert ---------------------------------------------------------------

def _topk_row(*, mode: TopkMode, seq_len: int, width: int, bs: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """One row of request-local top-k indices (int64, cast by the caller)."""
    if seq_len > 0 and mode is TopkMode.VALID:
        return _randint(gen, 0, seq_len, (k,))
    row = torch.full((k,), -1, dtype=torch.int64)
    n_valid = int(_randint(gen, 0, min(k, seq_len) + 1)) if seq_len > 0 else 0
    if n_valid:
        row[:n_valid] = torch.randperm(seq_len, generator=gen)[:n_valid]
        row = row[torch.randperm(k, generator=gen)]  # the indexer's order is not sorted
    if mode in (TopkMode.VALID, TopkMode.PADDED):
        return row
    classes = {
        TopkMode.NEGATIVE: (0,), TopkMode.PAST_TABLE: (1,), TopkMode.PAST_SEQ_LEN: (2,), TopkMode.MIXED: (0, 1, 2),
    }[mode]
    hit = _randint(gen, 0, 4, (k,)) == 0
    which = torch.tensor(classes)[_randint(gen, 0, len(classes), (k,))]
    past_table_lo = width * bs
    negative = torch.tensor([-2, -bs, -k, catalog.INT32_MIN, -(2 ** 20)])[_randint(gen, 0, 5, (k,))]
    past_table = past_table_lo + _randint(gen, 0, 2 * bs + 1, (k,))
    past_table = torch.where(_randint(gen, 0, 5, (k,)) == 0, torch.full_like(past_table, catalog.INT32_MAX), past_table)
    if past_table_lo > seq_len:
        past_seq = _randint(gen, seq_len, past_table_lo, (k,))
    else:
        past_seq = row  # no room between seq_len and the table's end: keep the row
    fill = torch.where(which == 0, negative, torch.where(which == 1, past_table, past_seq))
    return torch.where(hit, fill, row)


@materializer(ConvertSpec)
def materialize_convert(spec: ConvertSpec, gen: torch.Generator) -> Case:
    seq_lens = [r.seq_len for r in spec.requests]
    table, _pool = build_block_table(paging=spec.paging, seq_lens=seq_lens, gen=gen)
    bs = spec.paging.block_size
    rows, req_ids, ws_ids = [], [], []
    prefill_local = {}
    for r, req in enumerate(spec.requests):
        if req.prefill:
            prefill_local[r] = len(prefill_local)
        for _ in range(req.num_tokens):
            rows.append(_topk_row(mode=spec.topk_mode, seq_len=req.seq_len, width=table.shape[1], bs=bs,
                                  k=spec.topk, gen=gen))
            req_ids.append(r)
            ws_ids.append(prefill_local.get(r, -1))
    indices = torch.stack(rows) if rows else torch.zeros((0, spec.topk), dtype=torch.int64)
    tensors: dict[str, torch.Tensor | None] = {
        "req_id": torch.tensor(req_ids, dtype=torch.int32),
        "block_table": table,
        "token_indices": indices.to(torch.int32),
        "prefill_workspace_request_ids": None,
        "prefill_workspace_starts": None,
    }
    if spec.prefill_workspace:
        prefill_lens = [spec.requests[r].seq_len for r in prefill_local]
        starts = torch.tensor([0] + prefill_lens, dtype=torch.int64).cumsum(0)[:-1]
        tensors["prefill_workspace_request_ids"] = torch.tensor(ws_ids, dtype=torch.int32)
        tensors["prefill_workspace_starts"] = starts.to(torch.int32)
    params = {
        "BLOCK_SIZE": bs, "NUM_TOPK_TOKENS": spec.topk, "BLOCK_N": spec.block_n,
        "HAS_PREFILL_WORKSPACE": spec.prefill_workspace, "return_valid_counts": spec.return_valid_counts,
    }
    return Case(op="convert", spec=spec, seed=0, device="cpu", tensors=tensors, params=params)


# --- gather ----------------------------------------------------------------

@materializer(GatherSpec)
def materialize_gather(spec: GatherSpec, gen: torch.Generator) -> Case:
    table, pool = build_block_table(paging=spec.paging, seq_lens=[r.context_len for r in spec.requests], gen=gen)
    cache = make_cache(mode=spec.values, num_blocks=pool, block_size=spec.paging.block_size, gen=gen)
    lengths = [r.length for r in spec.requests]
    cum = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    ws = cum if spec.ws_form is WsForm.CUMULATIVE else cum[:-1]
    seq_starts = torch.tensor([r.seq_start for r in spec.requests], dtype=torch.int32)
    tensors = {
        "src_cache": cache,
        "block_table": table,
        "workspace_starts": ws.to(torch.int32),
        "seq_starts": seq_starts if spec.pass_seq_starts else None,
    }
    params = {"batch_size": len(spec.requests), "total": int(cum[-1])}
    return Case(op="gather", spec=spec, seed=0, device="cpu", tensors=tensors, params=params)
