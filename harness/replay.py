"""`mlafuzz replay BUNDLE`: run a repro bundle's case again.

Exit 1 while the bundle's case still draws a finding (the original or another),
0 once it passes, 2 when the bundle is malformed or was tampered with (its
inputs.pt no longer matches what its spec and seed generate).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from mlafuzz.harness.findings import Kind, Severity


def replay(*, bundle_path: Path, impl: str | None, device: str | None, quiet: bool) -> int:
    from mlafuzz.generators.materialize import materialize
    from mlafuzz.generators.spec import spec_from_dict
    from mlafuzz.harness.fuzz import evaluate_sync
    from mlafuzz.harness.bits import same_bits
    from mlafuzz.harness.shrink import same_finding
    from mlafuzz.harness.tasks import Task
    from mlafuzz.harness.workers import InProcess, WorkerPool
    from mlafuzz.kernels.registry import ImplError, parse_impl_arg, resolve
    from mlafuzz.reports.bundle import BundleError, read_bundle

    bundle = read_bundle(bundle_path)
    if device is None:
        device = "cuda" if bundle.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ImplError("--device cuda but no CUDA device is available here (use --device cpu)")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    spec = spec_from_dict(bundle.spec)
    regenerated = materialize(spec, bundle.seed, "cpu").tensors
    for name, stored in bundle.inputs.items():
        fresh = regenerated.get(name)
        if fresh is None or fresh.dtype != stored.dtype or fresh.shape != stored.shape or not same_bits(
                fresh, stored):
            raise BundleError(f"inputs.pt: tensor {name!r} does not match case.json's spec and seed"
                              " (tampered, or written by another mlafuzz version)")
    impl_ref = bundle.impl
    if impl:
        op, impl_ref = parse_impl_arg(impl)
        if op != bundle.op:
            raise ImplError(f"--impl {impl}: this bundle is for op {bundle.op!r}")
    resolve(bundle.op, impl_ref).load(device)
    task = Task(index=0, op=bundle.op, seed=bundle.seed, spec=bundle.spec, impl_ref=impl_ref, device=device,
                ulp=bundle.ulp, rerun=bundle.rerun, contract=bundle.contract)
    isolated = bundle.finding.kind in (Kind.CRASH, Kind.TIMEOUT)
    executor = WorkerPool(devices=[device if device == "cpu" else "cuda:0"], timeout=120.0) if isolated else InProcess()
    try:
        result = evaluate_sync(executor, task)
    finally:
        executor.close()
    errors = [f for f in result.findings if f.severity is Severity.ERROR]
    was = f"{bundle.finding.kind.value}: {bundle.finding.message}"
    if not errors:
        print(f"mlafuzz replay: passes on {bundle.op}={impl_ref} ({device}); the bundle recorded {was}")
        return 0
    for f in errors:
        tag = "reproduces" if same_finding(f, bundle.finding) else "other finding"
        print(f"mlafuzz replay: {tag}: {f.kind.value} {f.op}={f.impl}: {f.message}", file=sys.stdout)
    return 1
