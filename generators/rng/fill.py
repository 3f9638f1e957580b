"""Vectorized, device-exact builders of a case's tensors, each a pure function of its
arguments and a ``Stream`` (generators/hashing.py).

They run on the case's own device with no per-row or per-request Python loop,
and give the same bytes on CPU and CUDA: every random choice is an integer
function of the stream (hashing.py says why that is exact) and every float is
assembled from bit fields (fill_bits.py). Cache records live in
fill_records.py and are re-exported here.

``python -m mlafuzz.generators.rng.fill`` times the realistic sizes on whatever
device is present.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Callable

import torch
from torch import Tensor

from mlafuzz.generators import catalog
from mlafuzz.generators.rng.bits import (
    BF16,
    FORMATS,
    FP16,
    Device,
    HalfFormat,
    const,
    half_bits,
    half_pattern,
    normal_bits,
    normal_fields,
    pick,
    to_half,
)
from mlafuzz.generators.rng.hashing import Stream, scale_below
from mlafuzz.generators.rng.records import (  # noqa: F401  (re-exported)
    POOL_RECORDS,
    RECORD_BYTES,
    activations,
    all_codes,
    cache,
    cache_blocks,
    extreme_scales,
    make_pool,
    nan,
    records,
    records_at,
    subnormal,
)
from mlafuzz.generators.spec import Layout, TopkMode, ValueMode, WriterValues

__all__ = [
    "block_table", "topk_indices", "writer_inputs", "distinct_slots",
    # cache records (fill_records.py)
    "POOL_RECORDS", "RECORD_BYTES", "make_pool", "records", "records_at", "cache", "cache_blocks",
    "activations", "all_codes", "extreme_scales", "subnormal", "nan",
]

INT32_MAX = catalog.INT32_MAX


def _dev(device: Device) -> str:
    return str(torch.device(device))


# --- paging ------------------------------------------------------------------

def block_table(stream: Stream, *, blocks_per_request: Tensor, layout: Layout | str, spare_blocks: int = 0,
                extra_cols: int = 0, first_block_id: int = 0, device: Device) -> tuple[Tensor, int]:
    """Block table int32 [R, M] and the number of cache blocks it needs (first_block_id + pool).

    build_block_table's semantics (generators/materialize.py): request r owns
    blocks_per_request[r] blocks; shared_prefix lets every request start with
    the same max(1, min // 2) blocks (when R > 1 and min > 0); the pool of
    ids is arange or a random permutation; M = max + extra_cols (>= 1);
    entries past a request's blocks are 0. All ids are offset by
    first_block_id, so a case can put its blocks at the top of a huge cache
    (record byte offsets past 2**31 and 2**32). One host sync (min/max/sum).
    """
    layout = Layout(layout)
    need = blocks_per_request.to(device=device, dtype=torch.int64).reshape(-1)
    num_req = need.shape[0]
    lo, hi, total = torch.stack([need.min(), need.max(), need.sum()]).tolist() if num_req else (0, 0, 0)
    if lo < 0:
        raise ValueError(f"blocks_per_request has a negative entry ({lo})")
    shared = max(1, lo // 2) if layout is Layout.SHARED_PREFIX and num_req > 1 and lo > 0 else 0
    pool = max(shared + total - shared * num_req + spare_blocks, 1)
    if first_block_id < 0 or first_block_id + pool > INT32_MAX + 1:
        raise ValueError(f"first_block_id={first_block_id} + pool={pool}: block ids must fit int32")
    width = max(hi + extra_cols, 1)
    if layout is Layout.CONTIGUOUS:
        ids = torch.arange(pool, dtype=torch.int64, device=device)
    else:
        ids = stream.child("block_ids").permutation(pool, device=device)
    own = need - shared
    own_start = torch.cumsum(own, 0) - own  # where request r's own blocks start, past the shared ones
    col = torch.arange(width, dtype=torch.int64, device=device)
    # Column c < shared reads ids[c]; column c >= shared reads ids[shared + own_start + (c - shared)].
    index = col + (col >= shared) * own_start.unsqueeze(1)
    live = col < need.unsqueeze(1)
    table = torch.where(live, ids[torch.where(live, index, 0)] + first_block_id, 0)
    return table.to(torch.int32), first_block_id + pool


# --- top-k indices -----------------------------------------------------------

_CLASSES = {TopkMode.NEGATIVE: (0,), TopkMode.PAST_TABLE: (1,), TopkMode.PAST_SEQ_LEN: (2,),
            TopkMode.MIXED: (0, 1, 2)}
_KEEP, _CONST, _PAST_TABLE, _PAST_SEQ = range(4)


@functools.lru_cache(maxsize=64)
def _actions(mode: TopkMode, bs: int, k: int, device: str) -> tuple[Tensor, Tensor]:
    """What a random byte does to a column: (action, constant) tables of 256 entries.

    A quarter of the bytes replace the column: split evenly between the
    mode's classes; within negative, evenly between the five negatives;
    within past_table, a fifth give INT32_MAX. One gather per table replaces
    several compares and wheres per column.
    """
    classes = _CLASSES[mode]
    negatives = (-2, -bs, -k, catalog.INT32_MIN, -(2 ** 20))
    act, value = [_KEEP] * 256, [0] * 256
    for b in range(64):
        cls, r = divmod(b * len(classes), 64)  # r: where b sits within its class's share, 0..63
        if classes[cls] == 0:
            act[b], value[b] = _CONST, negatives[r * 5 // 64]
        elif classes[cls] == 1:
            act[b], value[b] = (_CONST, INT32_MAX) if r * 5 // 64 == 0 else (_PAST_TABLE, 0)
        else:
            act[b] = _PAST_SEQ
    return (torch.tensor(act, dtype=torch.int8, device=device),  # int8: the [N, K] gather writes 1 byte
            torch.tensor(value, dtype=torch.int64, device=device))


@functools.lru_cache(maxsize=32)
def _units(k: int, device: str) -> Tensor:
    """Multipliers a with gcd(a, k) == 1: c -> (a*c + b) % k is then a bijection of the columns."""
    return torch.tensor([a for a in range(1, k) if math.gcd(a, k) == 1] or [1], dtype=torch.int64, device=device)


def topk_indices(stream: Stream, *, seq_lens: Tensor, width: int, block_size: int, topk: int,
                 mode: TopkMode | str, device: Device) -> Tensor:
    """Request-local top-k rows, int32 [N, K], for rows of the given seq_lens (int64 [N]).

    _topk_row's classes (generators/materialize.py): valid -> K positions in
    [0, seq_len) (all -1 when seq_len == 0); padded -> n_valid positions, the
    rest -1, with n_valid uniform in [0, min(K, seq_len)] (1/8 of rows all -1
    and 1/8 full, so the edges are not left to chance). The valid columns are
    {c : (a*c + b) % K < n_valid} for a random unit a and offset b: an exact
    count, scattered over the row, not sorted. The other modes replace each
    column with probability 1/4 by a value of their class: negative (-2, -bs,
    -K, INT32_MIN, -2**20), past_table (M*bs .. M*bs + 2*bs, or INT32_MAX
    with probability 1/5), past_seq_len ([seq_len, M*bs), or the column kept
    when M*bs <= seq_len). Positions are NOT distinct within a row (the
    indexer's are): two columns may hold the same position.
    """
    mode = TopkMode(mode)
    seq = seq_lens.to(device=device, dtype=torch.int64).reshape(-1, 1)
    n, k, bs = seq.shape[0], topk, block_size
    if width * bs + 2 * bs > INT32_MAX:
        raise ValueError(f"width={width} * block_size={bs}: table positions must fit int32")
    w_pos = stream.child("pos").words((n, k), device=device)
    pos = scale_below(w_pos, seq)
    if mode is TopkMode.VALID:
        return torch.where(seq > 0, pos, -1).to(torch.int32)
    rw = stream.child("row").words((n, 3), device=device)
    cap = torch.clamp(seq[:, 0], max=k)
    n_valid = scale_below(rw[:, 0], cap + 1)
    edge = rw[:, 1] & 7
    n_valid = torch.where(edge == 0, 0, torch.where(edge == 1, cap, n_valid))
    units = _units(k, _dev(device))
    a = units[pick(rw[:, 1] >> 3, 29, units.shape[0])]
    col = torch.arange(k, dtype=torch.int64, device=device)
    rank = (col * a.unsqueeze(1) + scale_below(rw[:, 2:3], k)) % k
    row = torch.where(rank < n_valid.unsqueeze(1), pos, -1)
    if mode is TopkMode.PADDED:
        return row.to(torch.int32)
    # The column's action comes from the low byte of its position word, which saves a second hash:
    # pos and the other values are multiply-shifts, (w * bound) >> 32, that the low byte moves by
    # less than bound / 2**24 (under one unit for positions), so action and value are independent.
    byte = w_pos & 0xFF
    act_table, value_table = _actions(mode, bs, k, _dev(device))
    act = act_table[byte]
    out = torch.where(act == _CONST, value_table[byte], row)
    if mode in (TopkMode.PAST_TABLE, TopkMode.MIXED):
        out = torch.where(act == _PAST_TABLE, width * bs + scale_below(w_pos, 2 * bs + 1), out)
    if mode in (TopkMode.PAST_SEQ_LEN, TopkMode.MIXED):
        span = width * bs - seq  # no room past seq_len inside the table: the column keeps its value
        past_seq = seq + scale_below(w_pos, torch.clamp(span, min=0))
        out = torch.where((act == _PAST_SEQ) & (span > 0), past_seq, out)
    return out.to(torch.int32)


# --- writer inputs -----------------------------------------------------------

WRITER_TILES = 4096  # pool of 128-element kv_c tiles
WRITER_ROPES = 1024  # pool of 64-element k_pe rows

_WRITER_EXTREMES = {
    BF16: (0.0, -0.0, 1e-40, -1e-40, 3.0e38, -3.0e38, 448.0, 1e-45, 65504.0, 2.0 ** -126),  # materialize's list
    FP16: (0.0, -0.0, 1e-6, -1e-6, 65504.0, -65504.0, 448.0, 2.0 ** -24, 60000.0, 2.0 ** -14),  # its fp16 analogue
}
_NONFINITE = {BF16: (0x7FC0, 0x7F80, 0xFF80), FP16: (0x7E00, 0x7C00, 0xFC00)}
_ROPE_SPECIALS = {BF16: catalog.ROPE_SPECIAL_BITS,
                  FP16: (0x7E00, 0xFE00, 0x7C01, 0xFFFF, 0x7C00, 0xFC00, 0x0001, 0x8001, 0x0000, 0x8000)}
_WIDE_SHIFT = {BF16: (-30, 30), FP16: (-20, 12)}  # fp16: what its 2**-24..65504 range can hold


@functools.cache
def _extremes(fmt: HalfFormat) -> tuple[int, ...]:
    return tuple(half_pattern(v, fmt) for v in _WRITER_EXTREMES[fmt])


def _special(w: Tensor, table: tuple[int, ...], device: Device) -> Tensor:
    return const(table, _dev(device))[pick((w >> 10) & 63, 6, len(table))]


def _writer_tiles(stream: Stream, values: WriterValues, fmt: HalfFormat, device: Device) -> Tensor:
    w = stream.child("tiles").words((WRITER_TILES, 128), device=device)
    tile = stream.child("tile").words((WRITER_TILES, 1), device=device)
    sign, exp, mant = normal_fields(w, fmt)
    if values is WriterValues.WIDE:  # per-tile magnitude 2**lo .. 2**hi
        lo, hi = _WIDE_SHIFT[fmt]
        exp = exp + scale_below(tile, hi - lo + 1) + lo
    bits = half_bits(sign, exp, mant, fmt)
    hit = (w >> 24) & 0x7F
    if values is WriterValues.EXTREME:  # 1/3 of elements special, 1/6 of tiles all zero
        bits = torch.where(pick(hit, 7, 3) == 0, _special(w, _extremes(fmt), device), bits)
        bits = bits.masked_fill(scale_below(tile, 6) == 0, 0)
    elif values is WriterValues.NAN:  # 3/128 ~ 1/40 of elements NaN / +inf / -inf
        bits = torch.where(hit < 3, _special(w, _NONFINITE[fmt], device), bits)
    return bits


def _writer_ropes(stream: Stream, values: WriterValues, fmt: HalfFormat, device: Device) -> Tensor:
    w = stream.child("ropes").words((WRITER_ROPES, 64), device=device)
    bits = normal_bits(w, fmt)
    if values in (WriterValues.EXTREME, WriterValues.NAN):  # 1/8 NaN-with-payload / inf / subnormal patterns
        bits = torch.where(((w >> 24) & 0x7F) < 16, _special(w, _ROPE_SPECIALS[fmt], device), bits)
    return bits


def writer_inputs(stream: Stream, *, num_tokens: int, values: WriterValues | str,
                  dtype: torch.dtype = torch.bfloat16, device: Device) -> Tensor:
    """The writer's projection output, [T, 576] of bf16 or fp16: kv_c = [:, :512], k_pe = [:, 512:].

    Token rows are made of pool chunks: four kv_c tiles from a pool of 4096
    and one k_pe row from a pool of 1024, so a row is one gather of 9
    64-element chunks. The pools are built element by element (normal-like
    values, and the mode's per-tile spread / specials), so every tile of the
    batch has the mode's statistics; two tokens are equal with probability
    4096**-4 / 1024. Row i depends only on (stream, i).
    Modes (writer.py's): normal; wide (each pool tile scaled by 2**k, k in
    [-30, 30] for bf16, [-20, 12] for fp16 whose range is smaller); extreme;
    nan. fp16 gets fp16 analogues of the bf16 special values.
    """
    values, fmt = WriterValues(values), FORMATS[dtype]
    pool = stream.child(f"pool/{values.value}/{fmt.name}")  # modes and dtypes share no values
    tiles = _writer_tiles(pool, values, fmt, device).reshape(2 * WRITER_TILES, 64)
    ropes = _writer_ropes(pool, values, fmt, device)
    chunks = to_half(torch.cat([tiles, ropes]), dtype)
    pickw = stream.child("token").words((num_tokens, 5), device=device)
    tile_ids = scale_below(pickw[:, :4], WRITER_TILES).unsqueeze(2) * 2 + const((0, 1), _dev(device))
    rope_ids = scale_below(pickw[:, 4:], WRITER_ROPES) + 2 * WRITER_TILES
    index = torch.cat([tile_ids.reshape(num_tokens, 8), rope_ids], dim=1)
    return torch.index_select(chunks, 0, index.reshape(-1)).reshape(num_tokens, 576)


# --- slot mappings -----------------------------------------------------------

def distinct_slots(stream: Stream, *, n: int, num_slots: int, padding: bool = False, device: Device) -> Tensor:
    """n distinct slots in [0, num_slots), int64 [n], in random order; with padding, each is -1 w.p. 1/4.

    A sorted random sample, never a permutation of num_slots: draw v_i
    uniform in [0, num_slots - n], sort, add i (stars and bars: a
    non-decreasing sequence plus 0, 1, ... is strictly increasing, and stays
    below num_slots), then shuffle with a permutation of n. Every n-subset can
    come out; subsets are close to, not exactly, uniform. Costs O(n log n)
    whatever num_slots; num_slots - n < 2**31.
    """
    if not 0 <= n <= num_slots or num_slots - n >= 1 << 31:
        raise ValueError(f"n={n}, num_slots={num_slots}: need 0 <= n <= num_slots, num_slots - n < 2**31")
    draws = stream.child("draw").below(num_slots - n + 1, n, device=device)
    ranked = torch.sort(draws).values + torch.arange(n, dtype=torch.int64, device=device)
    slots = ranked[stream.child("order").permutation(n, device=device)]
    if padding:
        slots = torch.where(stream.child("pad").coin(1, 4, n, device=device), -1, slots)
    return slots


# --- timing (python -m mlafuzz.generators.rng.fill) ------------------------------

def _timed(label: str, fn: Callable[[int], Tensor], device: torch.device, repeats: int = 3) -> None:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = math.inf
    for i in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        out = fn(i)
        sync()
        if i:  # the first run warms allocators and lazy inits
            best = min(best, time.perf_counter() - t0)
    size = out.numel() * out.element_size()
    print(f"{label:<44} {best * 1e3:9.2f} ms  ({size / 2 ** 20:8.1f} MiB out)")


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {device} (torch {torch.__version__}, {torch.get_num_threads()} threads); best of 3")
    reqs, ctx, bs = 64, 4096, 64
    need = torch.full((reqs,), ctx // bs, dtype=torch.int64, device=device)
    _timed("block table 64 x 64 blocks (shuffled)", lambda i: block_table(
        Stream(i, "t"), blocks_per_request=need, layout="shuffled", device=device)[0], device)
    _timed("small cache 4 x 16 records (activations)", lambda i: cache(  # the fixed cost: pool + launches
        Stream(i, "c"), "activations", num_blocks=4, block_size=16, device=device), device)
    for mode in ValueMode:
        _timed(f"gather cache 64x4096 records ({mode.value})", lambda i, m=mode: cache(
            Stream(i, "c"), m, num_blocks=reqs * ctx // bs, block_size=bs, device=device), device)
    seqs = Stream(0, "s").integers(1, 1 << 17, 4096, device=device)
    for mode in (TopkMode.PADDED, TopkMode.MIXED):
        _timed(f"top-k 4096x2048 ({mode.value})", lambda i, m=mode: topk_indices(
            Stream(i, "k"), seq_lens=seqs, width=2048, block_size=bs, topk=2048, mode=m, device=device), device)
    _timed("top-k 32x2048 decode rows (mixed)", lambda i: topk_indices(
        Stream(i, "k"), seq_lens=seqs[:32], width=2048, block_size=bs, topk=2048, mode="mixed", device=device), device)
    for values in (WriterValues.NORMAL, WriterValues.EXTREME):
        _timed(f"writer inputs 65536 tokens ({values.value})", lambda i, v=values: writer_inputs(
            Stream(i, "w"), num_tokens=65536, values=v, device=device), device)
    _timed("distinct slots 65536 of 2**27 (padded)", lambda i: distinct_slots(
        Stream(i, "d"), n=65536, num_slots=1 << 27, padding=True, device=device), device)


if __name__ == "__main__":
    main()
