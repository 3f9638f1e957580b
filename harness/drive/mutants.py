"""The harness proves its power on the catalog of planted bugs (``mlafuzz mutants``).

Each mutant is fuzzed until it draws its expected finding kind, or its budget
(seconds, or cases) runs out; a mutant of one contract revision's rule is
judged under it (its entry's pin). The correct implementations are fuzzed in
the same run and must draw nothing, under every revision they follow (our
writers: both), else under the newest. A mutant expected to crash or hang its
process runs on an isolated executor (worker processes) even where the rest run
in this process. A mutant is fuzzed at the case sizes its entry names (``size``:
small, or large for a bug only caches past 2^32 bytes show). A mutant marked
``awaits`` (its bug only shows on inputs the generators do not draw yet) that
survives is reported as awaiting, not as survived. What a mutant compiles on first use (a CUDA
extension, a helper library) is built before its clock starts. Each gets its own run folder under ``out``, cleared first: a catalog
run replaces the last one, never appends to it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlafuzz.generators.draw import KNOB_PRESETS, SMALL
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.campaign import Campaign, CampaignError, run_campaign
from mlafuzz.harness.drive.fuzz import shrink_and_bundle
from mlafuzz.harness.drive.workers import Executor
from mlafuzz.harness.ops.names import NEWEST_REVISION, REVISIONS

ISOLATED_KINDS = frozenset({"CRASH", "TIMEOUT"})  # what a mutant can only show by taking its process down
CLEAN_FLOOR = 50  # cases a correct implementation runs at least before its "no findings" is printed


@dataclass(frozen=True, kw_only=True)
class MutantResult:
    op: str
    name: str
    expected: str
    killed: bool
    found: tuple[str, ...]
    cases: int
    seconds: float
    size: str
    awaits: str | None = None  # the catalog's mark: the inputs its bug needs are not drawn yet
    group: str | None = None  # the catalog family it belongs to (one recall line each)

    @property
    def failed(self) -> bool:
        """Survived although the drawn inputs should have killed it."""
        return not self.killed and self.awaits is None


def run_mutants(
    *,
    session: Session,
    ops: list[str],
    device: str,
    budget: float | None,
    cases: int | None,
    out: Path,
    seed: int,
    shrink_budget: float,
    executor: Executor,
    isolated: Callable[[], Executor] | None = None,
    on_result: Callable[[MutantResult], None] | None = None,
    on_clean: Callable[[str], None] | None = None,
) -> tuple[list[MutantResult], list[str]]:
    """(one result per mutant that runs here, the problems of the correct implementations).
    ``isolated``: the executor for mutants expected to crash or hang, asked for when the first one
    runs (None: ``executor`` isolates its cases already). ``on_result`` hears each mutant's result
    as soon as it is done (the CLI prints its row then: a run cut short still shows its part);
    ``on_clean`` hears a line per correct implementation's run, as each ends."""
    # The correct implementations first, same run, same budget per revision: they must stay clean,
    # and on a fresh machine they compile what every case of their op needs (generation, the fast
    # path's checks), which the first mutant of each op would otherwise pay inside its budget (on
    # the H200 a cold convert mutant ran 1 case in a 10 s budget and survived).
    clean_problems = []
    for op in ops:
        ref = session.default_ref(op, device)
        entry = session.entry(op, ref)
        revisions = [r for r in REVISIONS if entry.revisions and r in entry.revisions] or [NEWEST_REVISION]
        for revision in revisions:
            name = f"correct-{op}" if len(revisions) == 1 else f"correct-{op}-{revision}"
            campaign = Campaign(
                ops=(op,),
                impls=(f"{op}={ref}",),
                device=device,
                budget=budget,
                cases=cases,
                seed=seed,
                out_dir=out / name,
                knobs=SMALL,
                revision=revision,
                timeout=None,
            )
            summary = run_campaign(campaign, session=session, executor=executor).summary
            made, findings, kinds = summary.cases, summary.findings, set(summary.by_kind)
            if made < CLEAN_FLOOR and cases is None:
                # The budget went to building (on a fresh machine the CUDA extension takes ~30 s):
                # "no findings" of a handful of cases says nothing, so the rest are run by count.
                more = dataclasses.replace(
                    campaign, budget=None, cases=CLEAN_FLOOR - made, seed=seed + 1, out_dir=out / f"{name}-floor"
                )
                extra = run_campaign(more, session=session, executor=executor).summary
                made, findings, kinds = made + extra.cases, findings + extra.findings, kinds | set(extra.by_kind)
            if on_clean is not None:
                on_clean(f"{name} ({op}={ref}, revision {revision}): {made} cases, {findings} findings")
            if findings:
                clean_problems.append(
                    f"{op}={ref} (revision {revision}): {findings} findings ({', '.join(sorted(kinds))})"
                )
    results = []
    kind = device.split(":")[0]
    for entry in session.registry.entries(mutants=True):
        if entry.op not in ops or kind not in entry.devices or entry.missing():
            continue
        runner = isolated() if isolated is not None and entry.expected_kind in ISOLATED_KINDS else executor
        results.append(
            _run_mutant(
                entry,
                session=session,
                device=device,
                budget=budget,
                cases=cases,
                out=out,
                seed=seed,
                shrink_budget=shrink_budget,
                executor=runner,
            )
        )
        if on_result is not None:
            on_result(results[-1])
    return results, clean_problems


def _unloaded(entry: Any, expected: str, why: str, seconds: float) -> MutantResult:
    """The result of a mutant that cannot load here: not killed, its reason in the found column."""
    return MutantResult(
        op=entry.op,
        name=entry.name,
        expected=expected,
        killed=False,
        found=(f"cannot load: {why}",),
        cases=0,
        seconds=seconds,
        size="",
        awaits=entry.awaits,
        group=entry.group,
    )


def _run_mutant(
    entry: Any,
    *,
    session: Session,
    device: str,
    budget: float | None,
    cases: int | None,
    out: Path,
    seed: int,
    shrink_budget: float,
    executor: Executor,
) -> MutantResult:
    """Fuzz one mutant until it draws its expected kind or its budget ends; shrink the kill."""
    expected = entry.expected_kind or ""
    try:  # its extension or library built here, untimed: its budget is for cases
        entry.build(device)
    except Exception:  # noqa: BLE001 - the campaign reports it: loading it fails the same way
        pass
    campaign = Campaign(
        ops=(entry.op,),
        impls=(f"{entry.op}={entry.name}",),
        device=device,
        budget=budget,
        cases=cases,
        seed=seed,
        out_dir=out / entry.name,  # cleared first: a catalog run replaces the last one
        knobs=dataclasses.replace(KNOB_PRESETS[entry.size], **dict(entry.draws)),
        timeout=None,
    )
    start = time.monotonic()
    try:  # the executor (and its warm workers) is shared by every mutant
        result = run_campaign(campaign, session=session, executor=executor, stop_when=lambda s: expected in s.by_kind)
    except CampaignError as exc:  # it cannot even load here: it survives, and the row says why
        return _unloaded(entry, expected, str(exc), time.monotonic() - start)
    summary = result.summary
    seconds = time.monotonic() - start
    size = ""
    if expected in summary.by_kind and shrink_budget > 0:
        summary.buckets = {key: v for key, v in summary.buckets.items() if key[0] == expected}
        shrink_and_bundle(dataclasses.replace(result.config, shrink_budget=shrink_budget), summary, executor)
        shrunk = [b for b in summary.bundles if b["bucket"][0] == expected]  # each bucket is bundled as found too
        if shrunk:
            size = ", ".join(f"{k} {v}" for k, v in shrunk[0]["size"].items())
    return MutantResult(
        op=entry.op,
        name=entry.name,
        expected=expected,
        killed=expected in summary.by_kind,
        found=tuple(sorted(summary.by_kind)),
        cases=summary.cases,
        seconds=seconds,
        size=size,
        awaits=entry.awaits,
        group=entry.group,
    )
