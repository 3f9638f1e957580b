"""Case builders, device layouts and comparisons shared by the CUDA kernel tests."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from mlafuzz.kernels import cuda_ext
from mlafuzz.oracles import gather as gather_oracle

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
# A CPU test that runs Triton kernels on CPU tensors needs Triton's interpreter, which the suite turns
# on only where there is no CUDA device (tests/conftest.py): on a GPU machine it is skipped, and its
# `gpu` twin runs the same checks compiled (seen failing there, session 17, before this mark).
cpu_triton = pytest.mark.skipif(
    HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU tensors through Triton need its interpreter (off on a GPU machine); the gpu twin runs compiled",
)
SENTINELS = (0x5A5A, -0x2A2B)  # two non-NaN bf16 fills: a missed element shows under one of them
# The device the gpu tests run on. A module attribute (not a constant folded into the tests) so
# that the harness logic of this file can be dry-run on the CPU against a stand-in kernel.
DEV = torch.device("cuda")
PAD_BYTE = 0xEE  # fill of cache bytes outside the records (padded layouts)
FLT_MIN = 2.0**-126

# Layouts, each chosen because it selects a kernel path or a stride the kernel must honour.
CACHE_LAYOUTS = ("contig", "fp8", "offset1", "offset8", "block_pad", "entry_pad4", "entry_pad16")
DST_LAYOUTS = ("plain", "rowpad8", "rowpad3", "offset1", "colstride2")
TABLE_LAYOUTS = ("contig", "wide", "transposed")
SCALE_CATALOG = (
    1.0,
    0.5,
    1 / 448,
    448.0,
    FLT_MIN,
    1.5 * FLT_MIN,
    2.0**-127,
    2.0**-140,
    2.0**-149,
    1e-40,
    3.4028234663852886e38,
    1e38,
    2.0**100,
    2.0**-100,
    float("inf"),
    float("-inf"),
    float("nan"),
    0.0,
    -0.0,
    -1.0,
    -(2.0**-149),
    1.0000001,
)


def _sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- case builders


@dataclass(frozen=True)
class GatherCase:
    cache: torch.Tensor  # uint8 [num_blocks, bs, 656], CPU, contiguous
    block_table: torch.Tensor  # int32 [>= B, M], CPU
    ws: torch.Tensor  # int32 [B] or [B + 1]
    seq_starts: torch.Tensor | None  # int32 [B]
    batch_size: int
    total: int


def random_records(gen: torch.Generator, n: int) -> torch.Tensor:
    """uint8 [n, 656]: uniform random codes (all 256, NaN codes included) and rope bits; scales a
    third each from the catalog, random sign/magnitude over 2**-40..2**40, and raw random bits."""
    rec = torch.randint(0, 256, (n, 656), generator=gen, dtype=torch.uint8)
    kind = torch.randint(0, 3, (n, 4), generator=gen)
    cat = torch.tensor(SCALE_CATALOG, dtype=torch.float32)[torch.randint(0, len(SCALE_CATALOG), (n, 4), generator=gen)]
    mag = (torch.rand(n, 4, generator=gen) * 2 - 1) * torch.exp2(torch.randint(-40, 41, (n, 4), generator=gen).float())
    raw = rec[:, 512:528].clone().view(torch.float32)
    scales = torch.where(kind == 0, cat, torch.where(kind == 1, mag, raw))
    rec[:, 512:528] = scales.contiguous().view(torch.uint8)
    return rec


def scale_catalog_records() -> torch.Tensor:
    """One record per catalog scale (all four tiles) holding every code twice, plus records whose
    tiles mix catalog scales; rope with NaN / inf / subnormal bf16 patterns."""
    codes = torch.arange(256, dtype=torch.uint8).repeat(2)
    rope = (torch.arange(64, dtype=torch.int32) * 1031 % 65536).to(torch.int32)
    rope[:4] = torch.tensor([0x7FC1, 0xFF81, 0x0001, 0x7F80])
    rope_bytes = rope.to(torch.int16).view(torch.uint8)
    n = len(SCALE_CATALOG)
    rows = []
    for i in range(n + 8):
        tiles = [SCALE_CATALOG[i]] * 4 if i < n else [SCALE_CATALOG[(i * 5 + 3 * t) % n] for t in range(4)]
        scale_bytes = torch.tensor(tiles, dtype=torch.float32).view(torch.uint8)
        rows.append(torch.cat([codes.roll(i), scale_bytes, rope_bytes]))
    return torch.stack(rows)


def explicit_case(*, cache, lens, seq_starts, table, ws_form="B") -> GatherCase:
    ws_list = [sum(lens[:b]) for b in range(len(lens))]
    total = sum(lens)
    tail = {"B": [], "B+1": [total], "B+1-junk": [total + 12345]}[ws_form]
    table = table if isinstance(table, torch.Tensor) else torch.tensor(table, dtype=torch.int64)
    return GatherCase(
        cache=cache,
        block_table=table.to(torch.int32),
        ws=torch.tensor(ws_list + tail, dtype=torch.int32),
        seq_starts=None if seq_starts is None else torch.tensor(seq_starts, dtype=torch.int32),
        batch_size=len(lens),
        total=total,
    )


def gather_case(
    seed, *, bs, lens=None, batch_size=1, max_len=8, ws_form="B", ss_mode="random", shared=False, extra_rows=0
) -> GatherCase:
    """A random well-formed case: empty requests, nonzero seq_starts, shuffled blocks (or a small
    shared pool), table entries past each request's blocks filled with valid ids, extra rows."""
    gen = torch.Generator().manual_seed(seed)
    if lens is None:
        t = torch.randint(0, max_len + 1, (batch_size,), generator=gen)
        t[torch.rand(batch_size, generator=gen) < 0.25] = 0
        lens = t.tolist()
    nreq = len(lens)
    ss = [0] * nreq if ss_mode != "random" else torch.randint(0, 4 * bs + 3, (nreq,), generator=gen).tolist()
    need = [-(-(s + n) // bs) if n > 0 else 0 for s, n in zip(ss, lens)]
    m = max(need + [1]) + int(torch.randint(0, 3, (1,), generator=gen))
    nb = max(1, sum(need) // 2 + 1) if shared else sum(need) + 1 + int(torch.randint(0, 3, (1,), generator=gen))
    table = torch.randint(0, nb, (nreq + extra_rows, m), generator=gen)
    if not shared:
        perm, off = torch.randperm(nb, generator=gen), 0
        for b, k in enumerate(need):
            table[b, :k] = perm[off : off + k]
            off += k
    cache = random_records(gen, nb * bs).view(nb, bs, 656)
    return explicit_case(
        cache=cache, lens=lens, seq_starts=None if ss_mode == "none" else ss, table=table, ws_form=ws_form
    )


def special_values(gen: torch.Generator, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, 512] of dtype, each 128-tile in one mode: normal at a random scale, subnormal, huge,
    +-0, one NaN, all NaN, one +inf, one -inf, wide dynamic range, RNE ties under scale 1
    (amax pinned to 448), raw random bits."""
    fi = torch.finfo(dtype)
    shape = (rows, 4, 128)
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-12, 13, (rows, 4, 1), generator=gen).float())
    u = torch.rand(shape, generator=gen) * 2 - 1
    mode = torch.randint(0, 13, (rows, 4, 1), generator=gen).expand(shape)
    at = torch.zeros(shape, dtype=torch.bool).scatter_(2, torch.randint(0, 128, (rows, 4, 1), generator=gen), True)
    nan, inf = float("nan"), float("inf")
    x = torch.where(mode == 3, u * fi.tiny, x)
    x = torch.where(mode == 4, u * fi.max, x)
    x = torch.where(mode == 5, u * 0.0, x)
    x = torch.where((mode == 6) & at, nan, x)
    x = torch.where(mode == 7, nan, x)
    x = torch.where((mode == 8) & at, inf, x)
    x = torch.where((mode == 9) & at, -inf, x)
    x = torch.where(mode == 10, x * torch.exp2(torch.randint(-40, 20, shape, generator=gen).float()), x)
    ties = torch.randint(-448 * 16, 448 * 16 + 1, shape, generator=gen).float() / 16
    x = torch.where(mode == 11, torch.where(at, 448.0, ties), x)
    raw = torch.randint(-32768, 32768, (rows, 512), generator=gen, dtype=torch.int16).view(dtype)
    return torch.where((mode == 12).reshape(rows, 512), raw, x.reshape(rows, 512).to(dtype))


def kv_inputs(gen, *, bs, kv_dtype, pe_dtype):
    """(kv_c [T + 5, 512], k_pe [T + 5, 64], slot_mapping [T] with ~20% -1, random cache), CPU."""
    nb = max(4, 96 // bs)
    t = min(48, nb * bs)
    kv_c = special_values(gen, t + 5, kv_dtype)
    k_pe = torch.randint(-32768, 32768, (t + 5, 64), generator=gen, dtype=torch.int16).view(pe_dtype)
    slots = torch.randperm(nb * bs, generator=gen)[:t].to(torch.int64)
    slots[torch.rand(t, generator=gen) < 0.2] = -1
    cache = torch.randint(0, 256, (nb, bs, 656), generator=gen, dtype=torch.uint8)
    return kv_c, k_pe, slots, cache


# ----------------------------------------------------------------------------- device layouts


def place_cache(cache: torch.Tensor, layout: str, dev) -> torch.Tensor:
    """The CPU cache on the device in `layout` (bytes outside the records hold PAD_BYTE)."""
    nb, bs, _ = cache.shape
    n = cache.numel()
    if layout == "contig":
        return cache.to(dev)
    if layout == "fp8":
        return cache.to(dev).view(torch.float8_e4m3fn)
    if layout.startswith("offset"):  # storage offset: records not 16-byte aligned -> scalar path
        off = int(layout.removeprefix("offset"))
        buf = torch.full((n + 64,), PAD_BYTE, dtype=torch.uint8, device=dev)
        buf[off : off + n] = cache.reshape(-1).to(dev)
        return buf[off : off + n].view(nb, bs, 656)
    if layout == "block_pad":  # block stride (bs + 1) * 656
        big = torch.full((nb, bs + 1, 656), PAD_BYTE, dtype=torch.uint8, device=dev)
        big[:, :bs] = cache.to(dev)
        return big[:, :bs]
    width = {"entry_pad4": 660, "entry_pad16": 672}[layout]  # entry stride 660: scalar, 672: vector
    big = torch.full((nb, bs, width), PAD_BYTE, dtype=torch.uint8, device=dev)
    big[..., :656] = cache.to(dev)
    return big[..., :656]


def root_bytes(t: torch.Tensor) -> torch.Tensor:
    base = t if t._base is None else t._base
    return base.view(torch.uint8)


def place_table(table: torch.Tensor, layout: str, dev) -> torch.Tensor:
    if layout == "contig":
        return table.to(dev)
    if layout == "wide":  # row stride M + 5
        big = torch.full((table.shape[0], table.shape[1] + 5), -7, dtype=torch.int32)
        big[:, : table.shape[1]] = table
        return big.to(dev)[:, : table.shape[1]]
    return table.t().contiguous().to(dev).t()  # column stride = rows


def make_dst(total: int, layout: str, fill: int, dev, guard: int = 3):
    """(buffer, dst view, footprint mask of the buffer) with `guard` rows of sentinel around dst."""
    row_stride, col_stride, off0 = {
        "plain": (576, 1, 0),
        "rowpad8": (584, 1, 0),
        "rowpad3": (579, 1, 0),
        "offset1": (576, 1, 1),
        "colstride2": (1152, 2, 0),
    }[layout]
    off = guard * row_stride + off0
    size = off + (total + guard) * row_stride + 8
    buf = torch.full((size,), fill, dtype=torch.int16, device=dev).view(torch.bfloat16)
    dst = buf.as_strided((total, 576), (row_stride, col_stride), off)
    idx = off + torch.arange(total)[:, None] * row_stride + torch.arange(576)[None, :] * col_stride
    footprint = torch.zeros(size, dtype=torch.bool)
    footprint[idx.reshape(-1)] = True
    return buf, dst, footprint


def assert_rows_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """NoPE columns: NaN by position, other values bit for bit; RoPE columns bit for bit."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    expected = expected.to(actual.device)
    a, e = actual.view(torch.int16), expected.view(torch.int16)
    an, en = torch.isnan(actual), torch.isnan(expected)
    bad = a != e
    bad[:, :512] = (an[:, :512] != en[:, :512]) | (~an[:, :512] & bad[:, :512])
    if not bool(bad.any()):
        return
    rows, cols = bad.nonzero(as_tuple=True)
    rows, cols = rows.cpu(), cols.cpu()
    ac, ec = a.cpu(), e.cpu()
    first = "; ".join(
        f"[{int(r)},{int(c)}] got {int(ac[r, c]) & 0xFFFF:#06x} want {int(ec[r, c]) & 0xFFFF:#06x}"
        for r, c in list(zip(rows, cols))[:8]
    )
    exp_sub = ((ec & 0x7F80) == 0) & ((ec & 0x7F) != 0)
    flushed = int((exp_sub & (ac & 0x7FFF == 0))[rows, cols].sum())
    pytest.fail(
        f"{what}: mismatched elements {int(bad.sum())} / {bad.numel()} in {len(set(rows.tolist()))} rows "
        f"({flushed} look like subnormal flushes); first: {first}"
    )


def _oracle_gather(case) -> torch.Tensor:
    return gather_oracle.gather(
        src_cache=case.cache,
        block_table=case.block_table,
        workspace_starts=case.ws,
        batch_size=case.batch_size,
        seq_starts=case.seq_starts,
        total=case.total,
    )


def run_gather(
    case,
    *,
    cache_layout="contig",
    dst_layout="plain",
    table_layout="contig",
    rows_per_warp=2,
    force_scalar=False,
    stream_hints=False,
    expected=None,
    public=False,
):
    """Runs the kernel once per sentinel fill and checks: dst == oracle, nothing outside dst's
    footprint changed, inputs unchanged. Returns the dst of the last run (CPU)."""
    expected = _oracle_gather(case) if expected is None else expected
    dev = DEV
    cache = place_cache(case.cache, cache_layout, dev)
    table = place_table(case.block_table, table_layout, dev)
    ws = case.ws.to(dev)
    ss = None if case.seq_starts is None else case.seq_starts.to(dev)
    before = [t.clone() for t in (cache.view(torch.uint8), table, ws)] + ([ss.clone()] if ss is not None else [])
    out = None
    for fill in SENTINELS:
        buf, dst, footprint = make_dst(case.total, dst_layout, fill, dev)
        if public:
            cuda_ext.gather(cache, dst, table, ws, case.batch_size, ss)
        else:
            cuda_ext.gather_impl(
                cache,
                dst,
                table,
                ws,
                case.batch_size,
                ss,
                rows_per_warp=rows_per_warp,
                force_scalar=force_scalar,
                stream_hints=stream_hints,
            )
        _sync()
        out = dst.cpu()
        assert_rows_equal(out, expected, f"gather (fill {fill:#x}, {cache_layout}/{dst_layout}/{table_layout})")
        outside = buf.view(torch.int16).cpu()[~footprint]
        changed = int((outside != fill).sum())
        assert changed == 0, f"gather wrote {changed} elements outside dst ({dst_layout})"
    after = [t for t in (cache.view(torch.uint8), table, ws)] + ([ss] if ss is not None else [])
    for name, b, a in zip(("src_cache", "block_table", "workspace_starts", "seq_starts"), before, after):
        assert torch.equal(b, a), f"gather modified {name}"
    return out


def _random_matrix(n):
    """n cases cycling through every layout, table/ws/seq_starts form and tuning variant."""
    out = []
    for k in range(n):
        out.append(
            dict(
                seed=1000 + k,
                bs=(1, 3, 16, 64)[k % 4],
                cache_layout=CACHE_LAYOUTS[k % len(CACHE_LAYOUTS)],
                dst_layout=DST_LAYOUTS[(k // 2) % len(DST_LAYOUTS)],
                table_layout=TABLE_LAYOUTS[(k // 3) % len(TABLE_LAYOUTS)],
                ws_form=("B", "B+1", "B+1-junk")[(k // 4) % 3],
                ss_mode=("random", "none", "zeros")[k % 3],
                shared=bool((k // 5) % 2),
                rows_per_warp=(1, 2, 4, 8)[(k // 6) % 4],
                stream_hints=bool(k % 2),
                force_scalar=(k % 11 == 10),
            )
        )
    return out


@pytest.fixture(scope="module")
def ext():
    """The built extension (cold build time printed once per module)."""
    info = cuda_ext.load_extension()
    print(f"extension: cold={info.cold} {info.seconds:.1f} s arch={info.arch} {info.path}")
    return info
