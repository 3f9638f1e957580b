"""Tuning run for the fused gather check (oracles/fast_gather.py) at the realistic size, on the GPU:
the fill and the checks per (rows per program, warps) against a device copy of the same bytes,
plus the other per-case costs of the fast path. Run by `bash .ci/gpu checklab`."""

from __future__ import annotations

import torch

from mlafuzz.generators.materialize import materialize
from mlafuzz.harness.bench import realistic_spec, time_ms
from mlafuzz.harness.bits import differ_flag
from mlafuzz.harness.ops import _gather_fast_args
from mlafuzz.kernels.registry import resolve
from mlafuzz.oracles import fast_gather as fg


def main() -> None:
    case = materialize(realistic_spec("gather"), 1, "cuda")
    t, p = case.tensors, case.params
    total = p["total"]
    dst = torch.empty((total, 576), dtype=torch.bfloat16, device="cuda")
    resolve("gather", "cuda").load("cuda")(t["src_cache"], dst, t["block_table"], t["workspace_starts"],
                                            p["batch_size"], t["seq_starts"])
    dst2 = dst.clone()
    args = _gather_fast_args(case)
    moved = {0: total * (656 + 1152), 1: total * (656 + 1152), 2: total * (656 + 2304)}
    half = moved[1] // 2
    src = torch.empty(half, dtype=torch.uint8, device="cuda")
    cp = torch.empty_like(src)
    copy_ms, _ = time_ms(lambda: cp.copy_(src))
    copy_bw = moved[1] / copy_ms / 1e6
    print(f"{'what':<34} {'ms':>8} {'GB/s':>7} {'x copy':>7}")
    print(f"{'copy':<34} {copy_ms:>8.4f} {copy_bw:>7.0f} {1.0:>7.2f}")
    for rows, warps in ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (4, 4), (8, 4)):
        fg.ROWS_PER_PROGRAM, fg.NUM_WARPS = rows, warps
        scratch = torch.empty_like(dst)
        runs = {0: lambda: fg.gather_prefill(dst=scratch, **args),
                1: lambda: fg.gather_rows_flag(dst=dst, **args),
                2: lambda: fg.gather_rows_flag(dst=dst, dst2=dst2, **args)}
        for mode, fn in runs.items():
            ms, _ = time_ms(fn)
            bw = moved[mode] / ms / 1e6
            name = f"{['fill', 'check', 'check two'][mode]} rows {rows} warps {warps}"
            print(f"{name:<34} {ms:>8.4f} {bw:>7.0f} {bw / copy_bw:>7.2f}")
        assert not bool(fg.gather_rows_flag(dst=dst, dst2=dst2, **args)), "the check says no on our gather's output"
        assert bool(fg.gather_rows_flag(dst=scratch, **args)), "the check says yes on a prefilled dst"
    cache = t["src_cache"]
    other = cache.clone()
    for name, fn in (("clone cache", lambda: cache.clone()),
                     ("differ_flag cache", lambda: differ_flag(cache, other)),
                     ("record_offsets", lambda: fg.record_offsets(total=total, **{k: v for k, v in args.items()
                                                                                   if k != "rec"}))):
        ms, how = time_ms(fn)
        print(f"{name:<34} {ms:>8.4f}   ({how}; cache {cache.numel() / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
