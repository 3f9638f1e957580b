"""`mlafuzz bench`: kernel bandwidth against a device-to-device copy.

Effective bandwidth = (bytes that must be read + bytes that must be written) /
median time over repeats after warm-up, timed with CUDA events. Our kernel, the
torch implementation and a copy of the same byte count are measured in the
same run and printed as ratios to the copy. (``--harness``: harness.py.)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    nbytes: int  # bytes that must be read + written
    run: dict[str, Callable[[], object]]  # impl name -> zero-arg call


def time_ms(fn: Callable[[], object], *, warmup: int = 5, repeats: int = 30) -> tuple[float, str]:
    """Median ms per call. Replays of a captured CUDA graph where the call can be captured (so a
    microsecond kernel is not timed as its Python launch overhead); plain launches otherwise
    (an implementation that syncs with the host, like the torch gather, cannot be captured)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    call, how = fn, "launch"
    try:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()  # warm-up on the capture stream
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                fn()
        torch.cuda.synchronize()
        call, how = graph.replay, "graph"
    except Exception:  # not capturable: time plain launches
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), how


def _gather_workload(impls: dict[str, Callable], *, requests: int = 64, context: int = 4096, bs: int = 64) -> Workload:
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    blocks_per_req = context // bs
    num_blocks = requests * blocks_per_req
    cache = torch.randint(0, 256, (num_blocks, bs, 656), dtype=torch.uint8, device=dev, generator=gen)
    # Finite scales, so the timed math is the common path.
    cache[..., 512:528] = torch.full((4,), 0.01, device=dev).view(torch.uint8)
    table = torch.randperm(num_blocks, device=dev, generator=gen).to(torch.int32).reshape(requests, blocks_per_req)
    ws = torch.arange(requests, device=dev, dtype=torch.int32) * context
    starts = torch.zeros(requests, dtype=torch.int32, device=dev)
    total = requests * context
    dst = torch.empty((total, 576), dtype=torch.bfloat16, device=dev)
    nbytes = total * 656 + total * 576 * 2 + table.numel() * 4
    run = {name: (lambda fn=fn: fn(cache, dst, table, ws, requests, starts)) for name, fn in impls.items()}
    return Workload(name=f"gather {requests} req x {context} ctx, bs {bs}", nbytes=nbytes, run=run)


def _convert_workload(impls: dict[str, Callable], *, tokens: int = 4096, k: int = 2048, bs: int = 64) -> Workload:
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    requests, seq = 64, 8192
    table = torch.randint(0, 1 << 16, (requests, seq // bs), dtype=torch.int32, device=dev, generator=gen)
    req = torch.randint(0, requests, (tokens,), dtype=torch.int32, device=dev, generator=gen)
    idx = torch.randint(-1, seq, (tokens, k), dtype=torch.int32, device=dev, generator=gen)
    nbytes = idx.numel() * 4 * 2 + tokens * 4 * 2  # indices in, slots out, req in, counts out
    run = {
        name: (
            lambda fn=fn: fn(req, table, idx, BLOCK_SIZE=bs, NUM_TOPK_TOKENS=k, BLOCK_N=128, return_valid_counts=True)
        )
        for name, fn in impls.items()
    }
    return Workload(name=f"convert {tokens} tokens x K {k}", nbytes=nbytes, run=run)


def _writer_workload(impls: dict[str, Callable], *, tokens: int = 65536, bs: int = 64) -> Workload:
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    kv_c = torch.randn((tokens, 512), device=dev, generator=gen).to(torch.bfloat16)
    k_pe = torch.randn((tokens, 64), device=dev, generator=gen).to(torch.bfloat16)
    cache = torch.zeros((tokens // bs, bs, 656), dtype=torch.uint8, device=dev)
    slots = torch.randperm(tokens, device=dev, generator=gen)
    scale = torch.ones(1, device=dev)
    nbytes = kv_c.numel() * 2 + k_pe.numel() * 2 + slots.numel() * 8 + tokens * 656
    run = {name: (lambda fn=fn: fn(kv_c, k_pe, cache, slots, "fp8_ds_mla", scale)) for name, fn in impls.items()}
    return Workload(name=f"writer {tokens} tokens", nbytes=nbytes, run=run)


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "gather": _gather_workload,
    "convert": _convert_workload,
    "writer": _writer_workload,
}
OURS = {"gather": "cuda", "convert": "triton", "writer": "cuda"}


def gather_variants() -> dict[str, Callable]:
    """Every tuning variant of our CUDA gather (rows per warp x streaming hints), to
    pick the defaults from measurements on the GPU at hand."""
    import functools

    from mlafuzz.kernels import cuda_ext

    return {
        f"rows{rows}{'+cs' if hints else ''}": functools.partial(
            cuda_ext.gather_impl, rows_per_warp=rows, stream_hints=hints
        )
        for rows in cuda_ext.GATHER_ROWS_CHOICES
        for hints in (False, True)
    }


def bench_kernels(ops: list[str], *, repeats: int = 30, variants: bool = False) -> list[str]:
    from mlafuzz.kernels.registry import default_registry

    registry = default_registry()
    lines = [f"{'workload':<36} {'impl':<10} {'median ms':>10} {'GB/s':>8} {'x copy':>7}  timed as"]
    for op in ops:
        impls = {"ours": registry.get(op, OURS[op]).load("cuda"), "torch": registry.get(op, "torch").load("cuda")}
        if variants and op == "gather":
            impls.update(gather_variants())
        wl = WORKLOADS[op](impls)
        # A copy moving the same bytes: n/2 read plus n/2 written.
        half = wl.nbytes // 2
        src = torch.empty(half, dtype=torch.uint8, device="cuda").random_(0, 256)
        dst = torch.empty_like(src)
        copy_ms, how = time_ms(lambda: dst.copy_(src), repeats=repeats)
        copy_bw = wl.nbytes / copy_ms / 1e6
        lines.append(f"{wl.name:<36} {'copy':<10} {copy_ms:>10.4f} {copy_bw:>8.0f} {1.0:>7.2f}  {how}")
        for name, fn in wl.run.items():
            ms, how = time_ms(fn, repeats=repeats)
            bw = wl.nbytes / ms / 1e6
            lines.append(f"{wl.name:<36} {name:<10} {ms:>10.4f} {bw:>8.0f} {bw / copy_bw:>7.2f}  {how}")
        src = dst = wl = None  # free before the next workload
        torch.cuda.empty_cache()
    return lines
