"""The CUDA gather (kernels/csrc/kernels.cu) against the oracle, bit for bit (GPU).

Random and edge cases, every dst/cache layout that selects a different kernel path, guard zones
(two sentinel fills), inputs unchanged, and every tuning variant the oracle's bit for bit at a
realistic size (its bandwidth is ``mlafuzz bench``'s to report). NoPE columns compare bit for bit
with NaN by position (kernel 0x7FFF vs oracle 0x7FC0).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from mlafuzz.kernels import cuda_ext
from mlafuzz.oracles import codec
from mlafuzz.oracles import gather as gather_oracle
from mlafuzz.tests.support.cuda_cases import (
    DEV,
    _random_matrix,
    _sync,
    assert_rows_equal,
    explicit_case,
    ext,  # noqa: F401  (a fixture)
    gather_case,
    gpu,
    random_records,
    run_gather,
    scale_catalog_records,
)


@gpu
@pytest.mark.parametrize(
    "p", _random_matrix(48), ids=lambda p: f"s{p['seed']}-bs{p['bs']}-{p['cache_layout']}-{p['dst_layout']}"
)
def test_gather_random_vs_oracle(ext, p):
    case = gather_case(
        p["seed"],
        bs=p["bs"],
        batch_size=1 + p["seed"] % 9,
        max_len=3 * p["bs"] + 7,
        ws_form=p["ws_form"],
        ss_mode=p["ss_mode"],
        shared=p["shared"],
    )
    run_gather(
        case,
        cache_layout=p["cache_layout"],
        dst_layout=p["dst_layout"],
        table_layout=p["table_layout"],
        rows_per_warp=p["rows_per_warp"],
        stream_hints=p["stream_hints"],
        force_scalar=p["force_scalar"],
    )


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
    for rpw in (1, 8):
        run_gather(case, rows_per_warp=rpw)
    run_gather(case, rows_per_warp=4, stream_hints=True)
    run_gather(case, force_scalar=True, dst_layout="rowpad3")


@gpu
def test_gather_variants_agree_and_are_deterministic(ext):
    case = gather_case(4242, bs=16, batch_size=7, max_len=300, ss_mode="random", shared=True)
    dev = DEV
    cache = case.cache.to(dev)
    results = []
    variants = [(rpw, hints, False) for rpw in cuda_ext.GATHER_ROWS_CHOICES for hints in (False, True)]
    for rpw, hints, scalar in [*variants, (2, False, True), variants[0]]:
        dst = torch.empty(case.total, 576, dtype=torch.bfloat16, device=dev)
        cuda_ext.gather_impl(
            cache,
            dst,
            case.block_table.to(dev),
            case.ws.to(dev),
            case.batch_size,
            case.seq_starts.to(dev),
            rows_per_warp=rpw,
            force_scalar=scalar,
            stream_hints=hints,
        )
        results.append(dst.view(torch.int16).cpu())
    for r in results[1:]:
        assert torch.equal(r, results[0]), "gather variants / reruns differ bit for bit"


@gpu
@pytest.mark.parametrize(
    "bad",
    [
        "dst_f32",
        "dst_cols",
        "record_575",
        "ws_short",
        "table_rows",
        "ss_short",
        "ws_int64",
        "table_cpu",
        "batch_neg",
        "rows_per_warp3",
    ],
)
def test_gather_host_checks(ext, bad):
    dev = DEV
    cache = torch.zeros(4, 16, 656, dtype=torch.uint8, device=dev)
    dst = torch.full((10, 576), 7.0, dtype=torch.bfloat16, device=dev)
    table = torch.zeros(2, 4, dtype=torch.int32, device=dev)
    ws = torch.tensor([0, 5], dtype=torch.int32, device=dev)
    ss = torch.zeros(2, dtype=torch.int32, device=dev)
    args = dict(src_cache=cache, dst=dst, block_table=table, workspace_starts=ws, batch_size=2, seq_starts=ss)
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


# ----------------------------------------------------------------------------- GPU: the big case


@gpu
def test_gather_64x4096_is_the_oracles_with_every_tuning_variant(ext):
    """64 requests x 4096 context tokens, bs 64, shuffled blocks: the public gather and each rows-per-
    warp variant equal the oracle (run on the GPU). Their bandwidth is ``mlafuzz bench``'s to report
    (ratios in one run): a timed assertion here failed whenever the GPU was shared."""
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
    expected = gather_oracle.gather(
        src_cache=cache, block_table=table, workspace_starts=ws, batch_size=reqs, seq_starts=ss, total=total
    )
    dst = torch.full((total, 576), float("nan"), dtype=torch.bfloat16, device=dev)
    cuda_ext.gather(cache, dst, table, ws, reqs, ss)
    assert_rows_equal(dst, expected, "gather 64x4096")
    for rpw in cuda_ext.GATHER_ROWS_CHOICES:
        dst.fill_(float("nan"))
        cuda_ext.gather_impl(cache, dst, table, ws, reqs, ss, rows_per_warp=rpw)
        assert_rows_equal(dst, expected, f"gather 64x4096, rows_per_warp={rpw}")
