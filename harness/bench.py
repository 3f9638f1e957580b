"""`mlafuzz bench`: kernel bandwidth against a device-to-device copy, and the harness's own cost.

Kernel bench: effective bandwidth = (bytes that must be read + bytes that must
be written) / median time over repeats after warm-up, timed with CUDA events.
Our kernel, the torch implementation and a copy of the same byte count are
measured in the same run and printed as ratios to the copy.

Harness bench (``--harness``): cases/s at realistic sizes, the time split of
one checked case (generate, kernel, setup, inputs, rerun, oracle, guards) and
the runner's whole check timed as one; checks/kernel = (check - kernel) / kernel.
"""

from __future__ import annotations

import statistics
import time
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
    ws = (torch.arange(requests, device=dev, dtype=torch.int32) * context)
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
    run = {name: (lambda fn=fn: fn(req, table, idx, BLOCK_SIZE=bs, NUM_TOPK_TOKENS=k, BLOCK_N=128,
                                  return_valid_counts=True)) for name, fn in impls.items()}
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
    "gather": _gather_workload, "convert": _convert_workload, "writer": _writer_workload,
}
OURS = {"gather": "cuda", "convert": "triton", "writer": "cuda"}


def gather_variants() -> dict[str, Callable]:
    """Every tuning variant of our CUDA gather (rows per warp x streaming hints), to
    pick the defaults from measurements on the GPU at hand."""
    import functools

    from mlafuzz.kernels import cuda_ext

    return {f"rows{rows}{'+cs' if hints else ''}": functools.partial(
                cuda_ext.gather_impl, rows_per_warp=rows, stream_hints=hints)
            for rows in cuda_ext.GATHER_ROWS_CHOICES for hints in (False, True)}


def bench_kernels(ops: list[str], *, repeats: int = 30, variants: bool = False) -> list[str]:
    from mlafuzz.kernels.registry import resolve

    lines = [f"{'workload':<36} {'impl':<10} {'median ms':>10} {'GB/s':>8} {'x copy':>7}  timed as"]
    for op in ops:
        impls = {"ours": resolve(op, OURS[op]).load("cuda"), "torch": resolve(op, "torch").load("cuda")}
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


def realistic_spec(op: str):
    """The realistic sizes of issue 3: DeepSeek V3.2 shapes (K 2048, bs 64, BLOCK_N 128)."""
    from mlafuzz.generators import (
        ConvertRequest, ConvertSpec, GatherRequest, GatherSpec, Paging, TopkMode, ValueMode,
    )
    from mlafuzz.generators.writer import WriterSpec

    paging = Paging(block_size=64, layout="shuffled")
    return {
        "gather": lambda: GatherSpec(requests=(GatherRequest(context_len=4096, length=4096),) * 64,
                                     paging=paging, values=ValueMode.ALL_CODES),
        "convert": lambda: ConvertSpec(requests=(ConvertRequest(seq_len=8192, num_tokens=64),) * 64, paging=paging,
                                       topk=2048, block_n=128, topk_mode=TopkMode.PADDED),
        "writer": lambda: WriterSpec(num_tokens=65536, paging=paging),
    }[op]()


REPEATS = 5  # timings of the kernel and of check_call per case, their median kept
WARM = 5  # untimed checks of each case before its timed ones


def bench_harness(ops: list[str], *, cases: int = 4, seed: int = 0, profile: bool = False) -> list[str]:
    """Time split of checking realistic cases (``realistic_spec``), in this process, on the GPU:
    case generation, the kernel alone, and the runner's own check_call with its stages."""
    from mlafuzz.generators.materialize import materialize
    from mlafuzz.harness.compare import Policy
    from mlafuzz.harness.fuzz import case_seed
    from mlafuzz.harness.guards import PATTERNS
    from mlafuzz.harness.ops import OP_DEFS
    from mlafuzz.harness.runner import check_call, timed_stages
    from mlafuzz.kernels.registry import resolve

    def timed(fn: Callable[[], object]) -> tuple[object, float]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    cols = ("generate", "kernel", "setup", "inputs", "rerun", "oracle", "guards", "first", "check_call")
    lines = [f"{'op':<8} {'cases/s':>8} " + " ".join(f"{c:>10}" for c in cols) + f" {'checks/kernel':>14}",
             "  ms per case, medians. setup: copying inputs and filling guarded outputs for the first run;"
             " inputs: the input-mutation check (fast path: with the guard zones); rerun: the second run"
             " (guarded ops) with its setup;"
             " oracle: the fused check (GPU) or oracle + comparator; guards: guard zones and write map."
             " first: the first check of the case (the CUDA caching allocator still growing);"
             f" kernel, check_call: medians of {REPEATS} in a row, check_call in the steady state (after"
             f" {WARM} untimed checks of the case, the kernel after {WARM} untimed calls; stages"
             " timed with a sync each, so the columns add up to a little more);"
             " checks/kernel = (check_call - kernel) / kernel."]
    profiles: list[str] = []
    for op in ops:
        entry = resolve(op, OURS[op])
        fn = entry.load("cuda")
        opdef = OP_DEFS[op]
        stages: dict[str, list[float]] = {k: [] for k in cols}
        walls = []
        for i in range(cases + 1):  # case 0 warms up (JIT, extension load)
            s = case_seed(seed, op, i)
            t_start = time.perf_counter()
            case, t_gen = timed(lambda: materialize(realistic_spec(op), s, "cuda"))
            # The kernel alone, on ready arguments; everything else is the harness's cost.
            args = {**case.cloned_tensors(), **{k: g.view for k, g in (
                opdef.guarded(case, PATTERNS[0]) if opdef.guarded else {}).items()}}
            for _ in range(WARM):  # JIT-compile this case's kernel variant, and warm up as the checks are
                opdef.invoke(fn, case, args)
            t_kernel = statistics.median(timed(lambda: opdef.invoke(fn, case, args))[1] for _ in range(REPEATS))
            args = None
            check = lambda: check_call(case=case, entry=entry, fn=fn, policy=Policy(), rerun=False)  # noqa: E731
            # The first check of a case also pays the CUDA caching allocator growing to hold its
            # buffers; a run of like-sized cases pays that once. Timed: the steady state, with the
            # case's memo (row -> record map, slot owners) emptied so it is recomputed as a new
            # case would.
            findings, t_first = timed(check)
            t_checks = []
            for _ in range(WARM + REPEATS):  # the first WARM untimed: after generating a case, GPU and
                case.memo.clear()             # CPU take a few checks to reach their steady clocks
                t_checks.append(timed(check)[1])
            t_check = statistics.median(t_checks[WARM:])
            case.memo.clear()
            with timed_stages() as split:
                check()
            if findings:
                raise RuntimeError(f"bench --harness: our {op} drew findings on a realistic case: {findings[0].message}")
            if i == 0:
                continue
            walls.append(time.perf_counter() - t_start)
            values = (t_gen, t_kernel, split["run"] - t_kernel, split["inputs"], split["rerun"], split["oracle"],
                      split["guards"], t_first, t_check)
            for k, v in zip(cols, values):
                stages[k].append(v * 1e3)
        med = {k: statistics.median(v) for k, v in stages.items()}
        checks = (med["check_call"] - med["kernel"]) / max(med["kernel"], 1e-9)
        if profile:  # where one more check_call spends its time, by torch op and kernel
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            for _ in range(2):  # the first profile pays the profiler's own start-up: keep the second
                with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    check()
                    torch.cuda.synchronize()
            table = prof.key_averages()
            profiles.append(f"--- {op}: one check_call, by self CUDA time ---")
            profiles.append(table.table(sort_by="self_cuda_time_total", row_limit=12))
            profiles.append(f"--- {op}: by CPU time (total) ---")
            profiles.append(table.table(sort_by="cpu_time_total", row_limit=15))
        case = None
        lines.append(f"{op:<8} {cases / sum(walls):>8.2f} " + " ".join(f"{med[c]:>10.2f}" for c in cols)
                     + f" {checks:>14.2f}")
    return lines + profiles
