"""Replaying a repro bundle's case: is its finding still there?

The bundle's inputs.pt must match what its spec and seed generate (else it was
tampered with, or written by another mlafuzz version). A CRASH or TIMEOUT case
runs in an isolated worker, under the run's own per-case limit (case.json's
``timeout``); any other in this process.

A bundle is data, and may come from anywhere (a CI artifact, a bug report), so
replay never imports code because a bundle names it: it runs a built-in
implementation (a registered name, or ``vllm`` from the installed package),
the one the user names with ``impl_ref`` (``--impl``), or, only with
``trust_bundle``, the external ``module:attr`` / ``path.py:attr`` the bundle
recorded. inputs.pt is read with ``weights_only=True`` for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.shrink import evaluate_sync, same_finding
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
    """BundleError unless inputs.pt holds what the bundle's spec and seed generate (a cache with zero
    blocks: its blocks past them, ``Case.generated_tensors``)."""
    regenerated = table.materialize(table.decode(bundle.spec), bundle.seed, "cpu").generated_tensors()
    if set(regenerated) != set(bundle.inputs):
        raise BundleError(
            f"inputs.pt: holds tensors {sorted(bundle.inputs)}, case.json's spec and seed make"
            f" {sorted(regenerated)} (tampered, or written by another mlafuzz version)"
        )
    for name, stored in bundle.inputs.items():
        fresh = regenerated.get(name)
        if fresh is None or fresh.dtype != stored.dtype or fresh.shape != stored.shape or not same_bits(fresh, stored):
            raise BundleError(
                f"inputs.pt: tensor {name!r} does not match case.json's spec and seed"
                " (tampered, or written by another mlafuzz version)"
            )


DEFAULT_TIMEOUT = 120.0  # a bundle that recorded none (the fuzz command's default)


def replay(
    *,
    bundle_path: Path,
    impl_ref: str | None,
    device: str | None,
    table: OpTable,
    timeout: float | None = None,
    trust_bundle: bool = False,
    revision: str | None = None,
) -> ReplayResult:
    """Run the bundle's case again (see the module docstring); ``timeout`` overrides the bundle's;
    under its recorded contract revision unless ``revision`` says another (a bundle from before
    revisions replays under the newest)."""
    bundle = read_bundle(bundle_path)
    revision = revision or bundle.revision
    check_inputs(bundle, table)  # data only: a tampered bundle is said so before anything else
    session = Session(table=table)
    if impl_ref is None and not trust_bundle and not session.registry.is_builtin(bundle.op, bundle.impl):
        raise ImplError(
            f"replay: {bundle.path} names an external implementation, {bundle.op}={bundle.impl}, and "
            f"replay imports no code on a bundle's word: name it yourself (--impl "
            f"{bundle.op}={bundle.impl}) or pass --trust-bundle"
        )
    if device is None:
        device = "cuda" if bundle.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ImplError("--device cuda but no CUDA device is available here (use --device cpu)")
    ref = impl_ref or bundle.impl
    session.load(session.entry(bundle.op, ref), device)  # an impl that cannot run here: one line
    task = Task(
        index=0,
        op=bundle.op,
        seed=bundle.seed,
        spec=bundle.spec,
        impl_ref=ref,
        device=device,
        ulp=bundle.ulp,
        rerun=bundle.rerun,
        contract=bundle.contract,
        revision=revision,
    )
    isolated = bundle.finding.kind in (Kind.CRASH, Kind.TIMEOUT)
    limit = timeout if timeout is not None else bundle.timeout if bundle.timeout is not None else DEFAULT_TIMEOUT
    executor = (
        WorkerPool(devices=[device if device == "cpu" else "cuda:0"], timeout=limit)
        if isolated
        else InProcess(session=session)
    )
    try:
        result = evaluate_sync(executor, task)
    finally:
        executor.close()
    if result is None:  # evaluate_sync answers None only past a deadline, and none was given
        raise RuntimeError("replay: the case gave no result")
    errors = [f for f in result.findings if f.severity is Severity.ERROR]
    return ReplayResult(
        bundle=bundle,
        impl_ref=ref,
        device=device,
        revision=revision,
        found=tuple((f, same_finding(f, bundle.finding)) for f in errors),
    )
