"""Host and GPU timeline of one fast-path check, on the GPU: where check_call waits for what.

Each step of the fast path (snapshot, the call and its setup, the fused check, the fingerprints,
the board's sync) is wrapped: host start and end (perf_counter), and a CUDA event recorded at
each, whose time says when the GPU got there. A step whose GPU time trails its host time by a
lot ran behind GPU work; one whose GPU time is close to its host time found the GPU idle
(host-bound). One realistic case per op (memo cleared, as a fresh case), after warm-up checks.
`bash .ci/gpu timeline`; arguments: ops (default all three).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time

import torch
from harness_lab import per_call  # .ci/, this script's directory

import mlafuzz.harness.runner as runner
from mlafuzz.generators.materialize import materialize
from mlafuzz.harness.bench import OURS, realistic_spec
from mlafuzz.harness.compare import Policy
from mlafuzz.harness.ops import OP_DEFS
from mlafuzz.kernels.registry import resolve

EVENTS: list[tuple[str, float, torch.cuda.Event | None]] = []
WITH_EVENTS = os.environ.get("TIMELINE_EVENTS") == "1"  # else host times only (a mark costs ~0.2 us)


def mark(name: str) -> None:
    e = None
    if WITH_EVENTS:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
    EVENTS.append((name, time.perf_counter(), e))


def wrap(name: str, fn):
    def inner(*args, **kwargs):
        mark(f"{name} >")
        out = fn(*args, **kwargs)
        mark(f"{name} <")
        return out
    return inner


def main(ops: list[str]) -> None:
    import mlafuzz.oracles.fast_writer as fw

    for attr in ("_snapshot", "call_impl", "add_words", "untouched_zones", "differ_flag"):
        setattr(runner, attr, wrap(attr, getattr(runner, attr)))
    fw.slot_owners = wrap("slot_owners", fw.slot_owners)
    fw.writer_records_flag = wrap("records_flag", fw.writer_records_flag)
    for op in ops:
        entry = resolve(op, OURS[op])
        fn = entry.load("cuda")
        opdef = OP_DEFS[op]
        changes = {"invoke": wrap("invoke", opdef.invoke)}
        if opdef.fast_check is not None:
            changes["fast_check"] = wrap("fast_check", opdef.fast_check)
        if opdef.fast_prefill is not None:
            changes["fast_prefill"] = wrap("fast_prefill", opdef.fast_prefill)
        OP_DEFS[op] = dataclasses.replace(opdef, **changes)
        case = materialize(realistic_spec(op), 1, "cuda")
        walls = []
        runs = []
        for i in range(12):
            case.memo.clear()
            EVENTS.clear()
            torch.cuda.synchronize()
            mark("start")
            found = runner.check_call(case=case, entry=entry, fn=fn, policy=Policy(), rerun=False)
            mark("end")
            torch.cuda.synchronize()
            assert not found, found
            t0, g0 = EVENTS[0][1], EVENTS[0][2]
            rows = [(name, (t - t0) * 1e6, g0.elapsed_time(e) * 1e3 if e is not None else float("nan"))
                    for name, t, e in EVENTS]
            walls.append(rows[-1][1])
            runs.append(rows)
        keep = sorted(range(len(runs)), key=lambda j: walls[j])[len(runs) // 2]  # the median run
        print(f"== {op}: check_call (fresh case), median of {len(runs)} host us: {statistics.median(walls):.0f}"
              f" (min {min(walls):.0f}); the median run, us from its start:")
        print(f"   {'step':<20} {'host':>8} {'gpu':>8} {'gpu-host':>9}")
        for name, h, g in runs[keep]:
            print(f"   {name:<20} {h:8.0f} {g:8.0f} {g - h:9.0f}")
        OP_DEFS[op] = opdef


def primitives() -> None:
    """Host us per call of the fast path's building blocks, 300 calls each (no sync between),
    Triton's own launch against the compiled kernel's launcher called directly."""
    from mlafuzz.harness.bits import word_view
    from mlafuzz.harness.fingerprint import BLOCK, _fingerprints
    from mlafuzz.oracles import fast_writer as fw

    case = materialize(realistic_spec("writer"), 1, "cuda")
    t = case.tensors
    fn = resolve("writer", OURS["writer"]).load("cuda")
    words = [word_view(t[k]) for k in ("kv_c", "k_pe", "slot_mapping", "scale")]
    out = torch.zeros(8, dtype=torch.int64, device="cuda")
    args = []
    programs = 0
    for j, w in enumerate(words):
        args += [w, w.numel(), j]
        programs += -(-w.numel() // BLOCK)
    args += [out, 0, 0] * 4 + [0]  # the unused slots, mirror
    compiled = _fingerprints[(programs,)](out, *args, SIGN=1, BLOCK=BLOCK)
    direct = compiled[(programs, 1, 1)]
    after = t["kv_cache"].clone()
    cache = t["kv_cache"]
    blocks = {
        "view (v.view(v.shape))": lambda: cache.view(cache.shape),
        "word_view (bf16 [T, 512])": lambda: word_view(t["kv_c"]),
        "torch.zeros(8)": lambda: torch.zeros(8, dtype=torch.int64, device="cuda"),
        "torch.full(65537, -1)": lambda: torch.full((65537,), -1, dtype=torch.int32, device="cuda"),
        "torch.cat (3 small)": lambda: torch.cat([out[:4], out[4:6], out[6:]]),
        "clone of the cache (43 MB)": lambda: cache.clone(),
        "the writer op (ready args)": lambda: fn(t["kv_c"], t["k_pe"], after, t["slot_mapping"], "fp8_ds_mla", t["scale"]),
        "slot_owners (one launch)": lambda: fw.slot_owners(slot_mapping=t["slot_mapping"], num_slots=cache.shape[0] * cache.shape[1]),
        "fingerprints launch, Triton": lambda: _fingerprints[(programs,)](out, *args, SIGN=1, BLOCK=BLOCK),
        "fingerprints launch, direct": lambda: direct(out, *args, 1, BLOCK),
        "tolist (8 ints)": lambda: out.tolist(),
    }
    per_call(blocks, calls=300, host_only=True)


def writer_check_variants() -> None:
    """GPU time of the fused writer check on the realistic case, per variant of its constexprs."""
    from mlafuzz.oracles import fast_writer as fw
    from mlafuzz.oracles.triton_ieee import use_asm

    case = materialize(realistic_spec("writer"), 1, "cuda")
    t = case.tensors
    after = t["kv_cache"].clone()
    OP_DEFS["writer"].invoke(resolve("writer", OURS["writer"]).load("cuda"), case, {**t, "kv_cache": after})
    before = fw._record_bytes(t["kv_cache"])
    kv, pe = t["kv_c"], t["k_pe"]
    inv, gen = fw.slot_owners(slot_mapping=t["slot_mapping"], num_slots=before.shape[0] * before.shape[1])
    for use_cvt in (False, True):
        bad = torch.zeros(2, dtype=torch.int32, device="cuda")

        def launch():
            fw._check_records[(before.shape[0] * before.shape[1],)](
                after, before, kv, pe, inv, gen, bad, kv.stride(0), pe.stride(0),
                IS_BF16=kv.dtype == torch.bfloat16, USE_ASM=use_asm(after.device), USE_CVT=use_cvt, num_warps=1)

        for _ in range(3):
            launch()
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            launch()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        print(f"writer check USE_CVT={use_cvt!s:<5}: {statistics.median(times):7.1f} us GPU (median of 20),"
              f" verdict {bad.tolist()}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["convert", "gather", "writer"])
    primitives()
    writer_check_variants()
