"""Replaying a repro bundle's case: is its finding still there?

The bundle's inputs.pt must match what its spec and seed generate (else it was
tampered with, or written by another mlafuzz version). A CRASH or TIMEOUT case
runs in an isolated worker; any other in this process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import evaluate_sync
from mlafuzz.harness.drive.shrink import same_finding
from mlafuzz.harness.drive.tasks import Task
from mlafuzz.harness.drive.workers import InProcess, WorkerPool
from mlafuzz.harness.memory.bits import same_bits
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.kernels.entry import ImplError
from mlafuzz.reports.bundle import Bundle, BundleError, read_bundle
from mlafuzz.reports.findings import Finding, Kind, Severity


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    bundle: Bundle
    impl_ref: str
    device: str
    found: tuple[tuple[Finding, bool], ...]  # each error finding, and whether it is the bundle's own
    revision: str | None = None  # the run revision it replayed under (an entry's pin still wins)

    @property
    def passed(self) -> bool:
        return not self.found


def check_inputs(bundle: Bundle, table: OpTable) -> None:
    """BundleError unless inputs.pt holds what the bundle's spec and seed generate."""
    regenerated = table.materialize(table.decode(bundle.spec), bundle.seed, "cpu").tensors
    for name, stored in bundle.inputs.items():
        fresh = regenerated.get(name)
        if fresh is None or fresh.dtype != stored.dtype or fresh.shape != stored.shape or not same_bits(
                fresh, stored):
            raise BundleError(f"inputs.pt: tensor {name!r} does not match case.json's spec and seed"
                              " (tampered, or written by another mlafuzz version)")


def replay(*, bundle_path: Path, impl_ref: str | None, device: str | None, table: OpTable,
           timeout: float = 120.0, revision: str | None = None) -> ReplayResult:
    """The bundle's case again; under its recorded contract revision unless ``revision`` says
    another (a bundle from before revisions replays under the newest)."""
    bundle = read_bundle(bundle_path)
    revision = revision or bundle.revision
    if device is None:
        device = "cuda" if bundle.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ImplError("--device cuda but no CUDA device is available here (use --device cpu)")
    check_inputs(bundle, table)
    ref = impl_ref or bundle.impl
    session = Session(table=table)
    session.load(session.entry(bundle.op, ref), device)  # an impl that cannot run here: one line
    task = Task(index=0, op=bundle.op, seed=bundle.seed, spec=bundle.spec, impl_ref=ref, device=device,
                ulp=bundle.ulp, rerun=bundle.rerun, contract=bundle.contract, revision=revision)
    isolated = bundle.finding.kind in (Kind.CRASH, Kind.TIMEOUT)
    executor = (WorkerPool(devices=[device if device == "cpu" else "cuda:0"], timeout=timeout) if isolated
                else InProcess(session=session))
    try:
        result = evaluate_sync(executor, task)
    finally:
        executor.close()
    errors = [f for f in result.findings if f.severity is Severity.ERROR]
    return ReplayResult(bundle=bundle, impl_ref=ref, device=device, revision=revision,
                        found=tuple((f, same_finding(f, bundle.finding)) for f in errors))
