"""The CUDA fp8_ds_mla kernels (kernels/csrc/fp8_ds_mla.cu) against the oracles, bit for bit.

CPU, unmarked: the .cu (kernels + torch binding) compiles with nvcc for sm_90 without a GPU, and
the wrappers refuse bad calls before touching CUDA. GPU (mark ``gpu``): gather and writer against
``mlafuzz.oracles`` over random and edge cases, every dst/cache layout that selects a different
kernel path, guard zones (nothing written outside the output, every output element written:
two sentinel fills), inputs unchanged, the tuning variants agreeing bit for bit, and a bandwidth
check against a device-to-device copy (``MLAFUZZ_GATHER_MIN_BW_RATIO``, default 0.9).

Comparison policy (SPEC section 2): NoPE columns bit for bit with NaN compared by position
(kernel NaN 0x7FFF vs oracle 0x7FC0), RoPE columns and every written cache byte bit for bit.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass

import pytest
import torch

from mlafuzz.kernels import cuda_ext
from mlafuzz.oracles import codec
from mlafuzz.oracles import gather as gather_oracle

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
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
SCALE_CATALOG = (1.0, 0.5, 1 / 448, 448.0, FLT_MIN, 1.5 * FLT_MIN, 2.0**-127, 2.0**-140, 2.0**-149,
                 1e-40, 3.4028234663852886e38, 1e38, 2.0**100, 2.0**-100, float("inf"),
                 float("-inf"), float("nan"), 0.0, -0.0, -1.0, -(2.0**-149), 1.0000001)


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
    cat = torch.tensor(SCALE_CATALOG, dtype=torch.float32)[
        torch.randint(0, len(SCALE_CATALOG), (n, 4), generator=gen)]
    mag = (torch.rand(n, 4, generator=gen) * 2 - 1) * torch.exp2(
        torch.randint(-40, 41, (n, 4), generator=gen).float())
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
        cache=cache, block_table=table.to(torch.int32),
        ws=torch.tensor(ws_list + tail, dtype=torch.int32),
        seq_starts=None if seq_starts is None else torch.tensor(seq_starts, dtype=torch.int32),
        batch_size=len(lens), total=total)


def gather_case(seed, *, bs, lens=None, batch_size=1, max_len=8, ws_form="B", ss_mode="random",
                shared=False, extra_rows=0) -> GatherCase:
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
            table[b, :k] = perm[off:off + k]
            off += k
    cache = random_records(gen, nb * bs).view(nb, bs, 656)
    return explicit_case(cache=cache, lens=lens, seq_starts=None if ss_mode == "none" else ss,
                         table=table, ws_form=ws_form)


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
        buf[off:off + n] = cache.reshape(-1).to(dev)
        return buf[off:off + n].view(nb, bs, 656)
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
    row_stride, col_stride, off0 = {"plain": (576, 1, 0), "rowpad8": (584, 1, 0), "rowpad3": (579, 1, 0),
                                    "offset1": (576, 1, 1), "colstride2": (1152, 2, 0)}[layout]
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
    first = "; ".join(f"[{int(r)},{int(c)}] got {int(ac[r, c]) & 0xFFFF:#06x} want {int(ec[r, c]) & 0xFFFF:#06x}"
                      for r, c in list(zip(rows, cols))[:8])
    exp_sub = ((ec & 0x7F80) == 0) & ((ec & 0x7F) != 0)
    flushed = int((exp_sub & (ac & 0x7FFF == 0))[rows, cols].sum())
    pytest.fail(f"{what}: mismatched elements {int(bad.sum())} / {bad.numel()} in {len(set(rows.tolist()))} rows "
                f"({flushed} look like subnormal flushes); first: {first}")


# ----------------------------------------------------------------------------- CPU tests


def test_nvcc_compile_check(tmp_path):
    """The real kernel + binding translation unit compiles for sm_90 on a machine without GPU."""
    if cuda_ext._find_nvcc() is None:
        pytest.skip("nvcc not found: no CUDA toolkit on this machine (CI installs one)")
    t0 = time.perf_counter()
    obj = cuda_ext.nvcc_compile_check(out_dir=tmp_path)
    seconds = time.perf_counter() - t0
    data = obj.read_bytes()
    for kernel in (b"gather_vec_kernel", b"gather_scalar_kernel", b"writer_kernel"):
        assert kernel in data, f"{kernel!r} missing from {obj}"
    print(f"nvcc compile check: {seconds:.1f} s -> {obj} ({len(data)} bytes)")


def test_writer_rejects_other_kv_cache_dtype():
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        cuda_ext.writer(x, x[:, :64], torch.zeros(1, 1, 656, dtype=torch.uint8),
                        torch.zeros(1, dtype=torch.int64), kv_cache_dtype="auto")


def test_wrappers_refuse_cpu_tensors():
    cache = torch.zeros(1, 1, 656, dtype=torch.uint8)
    with pytest.raises(ValueError, match="CUDA"):
        cuda_ext.gather(cache, torch.zeros(1, 576, dtype=torch.bfloat16),
                        torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 1)
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        cuda_ext.writer(x, x[:, :64], cache, torch.zeros(1, dtype=torch.int64))


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU error path")
def test_load_extension_without_cuda_is_a_one_line_error():
    with pytest.raises(RuntimeError, match="no CUDA device") as err:
        cuda_ext.load_extension()
    assert "\n" not in str(err.value)


def test_build_key_depends_on_arch_and_flags():
    assert cuda_ext._build_key("sm_90") != cuda_ext._build_key("sm_100")
    flags = cuda_ext.nvcc_flags("sm_90")
    assert "-gencode=arch=compute_90,code=sm_90" in flags
    assert "-ftz=false" in flags and "-prec-div=true" in flags
    assert not any("fast_math" in f or "fast-math" in f for f in flags)


# ----------------------------------------------------------------------------- GPU: gather


@pytest.fixture(scope="module")
def ext():
    info = cuda_ext.load_extension()
    print(f"extension: cold={info.cold} {info.seconds:.1f} s arch={info.arch} {info.path}")
    return info


def _oracle_gather(case) -> torch.Tensor:
    return gather_oracle.gather(src_cache=case.cache, block_table=case.block_table,
                                workspace_starts=case.ws, batch_size=case.batch_size,
                                seq_starts=case.seq_starts, total=case.total)


def run_gather(case, *, cache_layout="contig", dst_layout="plain", table_layout="contig",
               rows_per_warp=2, force_scalar=False, expected=None, public=False):
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
            cuda_ext.gather_impl(cache, dst, table, ws, case.batch_size, ss,
                                 rows_per_warp=rows_per_warp, force_scalar=force_scalar)
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
        out.append(dict(
            seed=1000 + k, bs=(1, 3, 16, 64)[k % 4],
            cache_layout=CACHE_LAYOUTS[k % len(CACHE_LAYOUTS)],
            dst_layout=DST_LAYOUTS[(k // 2) % len(DST_LAYOUTS)],
            table_layout=TABLE_LAYOUTS[(k // 3) % len(TABLE_LAYOUTS)],
            ws_form=("B", "B+1", "B+1-junk")[(k // 4) % 3],
            ss_mode=("random", "none", "zeros")[k % 3],
            shared=bool((k // 5) % 2),
            rows_per_warp=(1, 2, 4)[(k // 6) % 3],
            force_scalar=(k % 11 == 10),
        ))
    return out


@gpu
@pytest.mark.parametrize("p", _random_matrix(48), ids=lambda p: f"s{p['seed']}-bs{p['bs']}-{p['cache_layout']}-{p['dst_layout']}")
def test_gather_random_vs_oracle(ext, p):
    case = gather_case(p["seed"], bs=p["bs"], batch_size=1 + p["seed"] % 9, max_len=3 * p["bs"] + 7,
                       ws_form=p["ws_form"], ss_mode=p["ss_mode"], shared=p["shared"])
    run_gather(case, cache_layout=p["cache_layout"], dst_layout=p["dst_layout"],
               table_layout=p["table_layout"], rows_per_warp=p["rows_per_warp"],
               force_scalar=p["force_scalar"])


@gpu
@pytest.mark.parametrize("layout", ["contig", "offset1"])
def test_gather_every_code_and_scale_catalog(ext, layout):
    """Every fp8 code under every catalog scale (FLT_MIN, subnormal, huge, inf, NaN, 0, -0, ...),
    read through the vector and the scalar path; the first records also against the loop oracle."""
    records = scale_catalog_records()
    n = records.shape[0]
    bs = 16
    nb = (n + bs - 1) // bs
    cache = random_records(torch.Generator().manual_seed(7), nb * bs)
    cache[:n] = records
    case = explicit_case(cache=cache.view(nb, bs, 656), lens=[n], seq_starts=[0], table=[list(range(nb))])
    out = run_gather(case, cache_layout=layout, public=True)
    assert_rows_equal(out[:8], codec.dequant_records_loop(records[:8]), "gather vs dequant_records_loop")


EDGE_BATCHES = {
    "total0": dict(lens=[0, 0, 0]),
    "batch0": dict(lens=[]),
    "leading_empty": dict(lens=[0, 0, 5, 1]),
    "trailing_empty": dict(lens=[4, 7, 0, 0]),
    "interleaved_empty": dict(lens=[0, 5, 0, 0, 7, 0, 1]),
    "single_rows": dict(lens=[1] * 40),
    "b31": dict(lens=[(i * 7) % 5 for i in range(31)]),
    "b32": dict(lens=[(i * 7) % 5 for i in range(32)]),
    "b33": dict(lens=[(i * 7) % 5 for i in range(33)]),
    "b1023": dict(lens=[(i * 13) % 4 for i in range(1023)]),
    "b1025": dict(lens=[(i * 13) % 4 for i in range(1025)]),
    "b3000_sparse": dict(lens=[3 if i % 97 == 0 else 0 for i in range(3000)]),
    "extra_table_rows_and_ws": dict(lens=[3, 9, 2], extra_rows=4, ws_form="B+1-junk"),
}


@gpu
@pytest.mark.parametrize("name", list(EDGE_BATCHES))
@pytest.mark.parametrize("bs", [1, 3, 64])
def test_gather_edge_batches(ext, name, bs):
    kw = dict(EDGE_BATCHES[name])
    case = gather_case(zlib.crc32(f"{name}/{bs}".encode()), bs=bs, ss_mode="random", **kw)
    for rpw in (1, 4):
        run_gather(case, rows_per_warp=rpw)
    run_gather(case, force_scalar=True, dst_layout="rowpad3")


@gpu
def test_gather_variants_agree_and_are_deterministic(ext):
    case = gather_case(4242, bs=16, batch_size=7, max_len=300, ss_mode="random", shared=True)
    dev = DEV
    cache = case.cache.to(dev)
    results = []
    for rpw, scalar in ((1, False), (2, False), (4, False), (2, True), (2, False)):
        dst = torch.empty(case.total, 576, dtype=torch.bfloat16, device=dev)
        cuda_ext.gather_impl(cache, dst, case.block_table.to(dev), case.ws.to(dev), case.batch_size,
                             case.seq_starts.to(dev), rows_per_warp=rpw, force_scalar=scalar)
        results.append(dst.view(torch.int16).cpu())
    for r in results[1:]:
        assert torch.equal(r, results[0]), "gather variants / reruns differ bit for bit"


@gpu
@pytest.mark.parametrize("bad", ["dst_f32", "dst_cols", "record_575", "ws_short", "table_rows",
                                 "ss_short", "ws_int64", "table_cpu", "batch_neg", "rows_per_warp3"])
def test_gather_host_checks(ext, bad):
    dev = DEV
    cache = torch.zeros(4, 16, 656, dtype=torch.uint8, device=dev)
    dst = torch.full((10, 576), 7.0, dtype=torch.bfloat16, device=dev)
    table = torch.zeros(2, 4, dtype=torch.int32, device=dev)
    ws = torch.tensor([0, 5], dtype=torch.int32, device=dev)
    ss = torch.zeros(2, dtype=torch.int32, device=dev)
    args = dict(src_cache=cache, dst=dst, block_table=table, workspace_starts=ws, batch_size=2,
                seq_starts=ss)
    extra = {}
    if bad == "dst_f32":
        args["dst"] = torch.zeros(10, 576, device=dev)
    elif bad == "dst_cols":
        args["dst"] = torch.zeros(10, 512, dtype=torch.bfloat16, device=dev)
    elif bad == "record_575":
        args["src_cache"] = torch.zeros(4, 16, 575, dtype=torch.uint8, device=dev)
    elif bad == "ws_short":
        args["workspace_starts"] = ws[:1]
    elif bad == "table_rows":
        args["block_table"] = table[:1]
    elif bad == "ss_short":
        args["seq_starts"] = ss[:1]
    elif bad == "ws_int64":
        args["workspace_starts"] = ws.long()
    elif bad == "table_cpu":
        args["block_table"] = table.cpu()
    elif bad == "batch_neg":
        args["batch_size"] = -1
    elif bad == "rows_per_warp3":
        extra["rows_per_warp"] = 3
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        cuda_ext.gather_impl(*args.values(), **extra)
    _sync()
    assert bool((dst == 7.0).all()), "a rejected call wrote dst"


# ----------------------------------------------------------------------------- GPU: writer


def _check_cache_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    a = actual.reshape(-1, 656).cpu()
    e = expected.reshape(-1, 656).cpu()
    bad = a != e
    if bad.any():
        rows, cols = bad.nonzero(as_tuple=True)
        part = lambda c: "code" if c < 512 else ("scale" if c < 528 else "rope")  # noqa: E731
        first = "; ".join(f"slot {int(r)} byte {int(c)} ({part(int(c))}) got {int(a[r, c]):#04x} "
                          f"want {int(e[r, c]):#04x}" for r, c in list(zip(rows, cols))[:8])
        pytest.fail(f"{what}: {int(bad.sum())} bytes differ in {len(set(rows.tolist()))} slots; {first}")


WRITER_CASES = [
    dict(seed=s, bs=(1, 16, 64)[s % 3], kv_dtype=d[0], pe_dtype=d[1],
         cache_layout=("contig", "fp8", "offset1", "offset8", "entry_pad4", "block_pad")[s % 6],
         fused=bool(s % 2) and d[0] == d[1])
    for s, d in enumerate([(torch.bfloat16, torch.bfloat16)] * 6 + [(torch.float16, torch.float16)] * 4
                          + [(torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)])
]


@gpu
@pytest.mark.parametrize("p", WRITER_CASES, ids=lambda p: f"s{p['seed']}-bs{p['bs']}-{p['cache_layout']}")
def test_writer_random_vs_oracle(ext, p):
    """Special values per tile (NaN, all-NaN, +-inf, huge, subnormal, zeros, random bits, RNE ties),
    slot -1 padding, extra kv_c rows, fused (strided) kv_c/k_pe: the whole cache must equal
    codec.write_records byte for byte, untouched slots included."""
    gen = torch.Generator().manual_seed(p["seed"])
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=p["bs"], kv_dtype=p["kv_dtype"], pe_dtype=p["pe_dtype"])
    expected = codec.write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots)
    dev = DEV
    dev_cache = place_cache(cache, p["cache_layout"], dev)
    kv_c_d, k_pe_d, slots_d = kv_c.to(dev), k_pe.to(dev), slots.to(dev)
    if p["fused"]:  # views of one [T, 576 + 8] tensor, as vLLM slices one projection output
        both = torch.cat([kv_c, k_pe, torch.zeros(kv_c.shape[0], 8, dtype=kv_c.dtype)], 1).to(dev)
        kv_c_d, k_pe_d = both[:, :512], both[:, 512:576]
    inputs_before = [kv_c_d.clone(), k_pe_d.clone(), slots_d.clone()]
    cuda_ext.writer(kv_c_d, k_pe_d, dev_cache, slots_d, "fp8_ds_mla", None)
    _sync()
    _check_cache_equal(dev_cache.view(torch.uint8), expected, f"writer {p}")
    # Whole underlying buffer (padding between records included) == the expected cache placed
    # the same way: nothing written outside the records.
    assert torch.equal(root_bytes(dev_cache), root_bytes(place_cache(expected, p["cache_layout"], dev))), \
        "writer wrote outside the records (layout padding changed)"
    for b, a in zip(inputs_before, (kv_c_d, k_pe_d, slots_d)):  # bitwise: inputs hold NaNs
        assert torch.equal(b.view(torch.int16 if b.element_size() == 2 else b.dtype),
                           a.view(torch.int16 if a.element_size() == 2 else a.dtype)), "writer modified an input"


@gpu
def test_writer_convert_fp16_rope_option(ext):
    gen = torch.Generator().manual_seed(5)
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=16, kv_dtype=torch.float16, pe_dtype=torch.float16)
    k_pe[:, :8] = torch.tensor([float("nan"), float("inf"), -float("inf"), 6e-8, 1 + 2**-8, 1 + 3 * 2**-9,
                                65504.0, -0.0], dtype=torch.float16)  # NaN, inf, subnormal, RNE ties
    expected = codec.write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots)
    rope = k_pe[: slots.numel()].float().to(torch.bfloat16).view(torch.int16)
    rope = torch.where(torch.isnan(k_pe[: slots.numel()]), torch.full_like(rope, 0x7FC0), rope)
    flat = expected.view(-1, 656)
    valid = slots >= 0
    flat[slots[valid], 528:] = rope[valid].contiguous().view(torch.uint8).view(-1, 128)
    dev_cache = cache.to(DEV)
    cuda_ext.writer_impl(kv_c.to(DEV), k_pe.to(DEV), dev_cache, slots.to(DEV), convert_fp16_rope=True)
    _check_cache_equal(dev_cache, expected, "writer convert_fp16_rope")


@gpu
def test_writer_no_valid_slots_and_empty(ext):
    gen = torch.Generator().manual_seed(9)
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=16, kv_dtype=torch.bfloat16, pe_dtype=torch.bfloat16)
    dev_cache = cache.to(DEV)
    cuda_ext.writer(kv_c.to(DEV), k_pe.to(DEV), dev_cache, torch.full_like(slots, -1).to(DEV))
    cuda_ext.writer(kv_c[:0].to(DEV), k_pe[:0].to(DEV), dev_cache, slots[:0].to(DEV))
    _check_cache_equal(dev_cache, cache, "writer with only padding tokens")


@gpu
def test_writer_then_gather_roundtrip(ext):
    """Pipeline: our writer fills a cache, our gather reads it back == oracle gather of the
    oracle-written cache."""
    gen = torch.Generator().manual_seed(11)
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=16, kv_dtype=torch.bfloat16, pe_dtype=torch.bfloat16)
    expected_cache = codec.write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots)
    dev_cache = cache.to(DEV)
    cuda_ext.writer(kv_c.to(DEV), k_pe.to(DEV), dev_cache, slots.to(DEV))
    nb, bs = cache.shape[:2]
    half = nb * bs // 2
    case = explicit_case(cache=expected_cache, lens=[half, nb * bs - half], seq_starts=[0, half],
                         table=[list(range(nb))] * 2)
    expected = _oracle_gather(case)
    dst = torch.empty(case.total, 576, dtype=torch.bfloat16, device=DEV)
    cuda_ext.gather(dev_cache, dst, case.block_table.to(DEV), case.ws.to(DEV), 2, case.seq_starts.to(DEV))
    assert_rows_equal(dst.cpu(), expected, "writer -> gather roundtrip")


@gpu
@pytest.mark.parametrize("bad", ["kv_f32", "kv_cols", "pe_cols", "slots_int32", "few_rows",
                                 "cache_657", "cache_cpu_slots"])
def test_writer_host_checks(ext, bad):
    dev = DEV
    kv_c = torch.zeros(4, 512, dtype=torch.bfloat16, device=dev)
    k_pe = torch.zeros(4, 64, dtype=torch.bfloat16, device=dev)
    cache = torch.full((2, 4, 656), 9, dtype=torch.uint8, device=dev)
    slots = torch.arange(4, dtype=torch.int64, device=dev)
    args = [kv_c, k_pe, cache, slots]
    if bad == "kv_f32":
        args[0] = kv_c.float()
    elif bad == "kv_cols":
        args[0] = kv_c[:, :511]
    elif bad == "pe_cols":
        args[1] = torch.zeros(4, 32, dtype=torch.bfloat16, device=dev)
    elif bad == "slots_int32":
        args[3] = slots.int()
    elif bad == "few_rows":
        args[0] = kv_c[:3]
    elif bad == "cache_657":
        args[2] = torch.zeros(2, 4, 657, dtype=torch.uint8, device=dev)
    elif bad == "cache_cpu_slots":
        args[3] = slots.cpu()
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        cuda_ext.writer(*args)
    _sync()
    assert bool((cache == 9).all()), "a rejected call wrote the cache"


# ----------------------------------------------------------------------------- GPU: the big case


def _time_ms(fn, iters=20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    _sync()
    return start.elapsed_time(end) / iters


@gpu
def test_gather_64x4096_correct_and_near_copy_bandwidth(ext):
    """64 requests x 4096 context tokens, bs 64, shuffled blocks: equal to the oracle (run on the
    GPU), and at least MLAFUZZ_GATHER_MIN_BW_RATIO (default 0.9) of a d2d copy's bandwidth."""
    dev = DEV
    gen = torch.Generator(device=dev).manual_seed(0)
    reqs, ctx, bs = 64, 4096, 64
    nb = reqs * ctx // bs
    cache = torch.randint(0, 256, (nb, bs, 656), generator=gen, dtype=torch.uint8, device=dev)
    cache[..., 512:528] = torch.rand(nb, bs, 4, generator=gen, device=dev).view(torch.uint8).view(nb, bs, 16)
    table = torch.randperm(nb, generator=gen, device=dev).to(torch.int32).view(reqs, ctx // bs)
    ws = (torch.arange(reqs, device=dev, dtype=torch.int32) * ctx).contiguous()
    ss = torch.zeros(reqs, dtype=torch.int32, device=dev)
    total = reqs * ctx
    dst = torch.empty(total, 576, dtype=torch.bfloat16, device=dev)
    cuda_ext.gather(cache, dst, table, ws, reqs, ss)
    expected = gather_oracle.gather(src_cache=cache, block_table=table, workspace_starts=ws,
                                    batch_size=reqs, seq_starts=ss, total=total)
    assert_rows_equal(dst, expected, "gather 64x4096")
    del expected

    copy_src = torch.empty(total * 1152, dtype=torch.uint8, device=dev)
    copy_dst = torch.empty_like(copy_src)
    copy_ms = _time_ms(lambda: copy_dst.copy_(copy_src))
    copy_bw = 2 * copy_src.numel() / copy_ms / 1e6  # GB/s, read + write
    moved = total * (656 + 1152)
    report = {}
    for rpw in (1, 2, 4):
        ms = _time_ms(lambda: cuda_ext.gather_impl(cache, dst, table, ws, reqs, ss, rows_per_warp=rpw))
        report[rpw] = (ms, moved / ms / 1e6)
    ms_pub = _time_ms(lambda: cuda_ext.gather(cache, dst, table, ws, reqs, ss))
    ratio = moved / ms_pub / 1e6 / copy_bw
    lines = ", ".join(f"rows_per_warp={k}: {v[0] * 1e3:.0f} us {v[1]:.0f} GB/s" for k, v in report.items())
    msg = (f"copy {copy_bw:.0f} GB/s; gather (public) {ms_pub * 1e3:.0f} us = {ratio:.1%} of copy; {lines}")
    print(msg)
    need = float(os.environ.get("MLAFUZZ_GATHER_MIN_BW_RATIO", "0.9"))
    assert ratio >= need, msg
