"""The CLI's and the pytest plugin's words: every line they print is made here.

The harness decides and counts; these functions only turn its records (a
finding, summary.json's dict, a judgement, a mutant's result) into text. Long
runs' live panel is in progress.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

from mlafuzz.reports.findings import Finding, Kind, Severity
from mlafuzz.reports.invocation import command
from mlafuzz.reports.model import (
    NOT_APPLICABLE,
    Bucket,
    Judgement,
    Waiver,
    bucket_counts,
    group_buckets,
    plural,
    replay_command,
)

__all__ = ["plural"]  # re-exported: the CLI and the plugin word counts through console


def finding_line(f: Finding) -> str:
    """One new bucket's first finding, as the fuzz loop announces it (an exception's, with the
    implementation's line that raised it)."""
    where = raised_at(f)
    # An info (an error input outside the implementation's contract that ran) never fails the run:
    # said so on its line, since a default GPU run of our own gather prints one every time.
    info = "info, not failing: " if f.severity is not Severity.ERROR else ""
    return f"  {info}{f.kind.value} {f.op}={f.impl} {f.case_id}: {f.message}" + (f" (at {where})" if where else "")


def raised_at(f: Finding) -> str:
    """``file:line in function`` of the innermost frame of an EXCEPTION's traceback ('' if none)."""
    if f.kind is not Kind.EXCEPTION:
        return ""
    for line in reversed(f.extra.get("traceback") or ()):
        text = line.strip()
        if text.startswith('File "'):
            path, _, rest = text[len('File "') :].partition('", line ')
            number, _, func = rest.partition(", in ")
            return f"{Path(path).name}:{number} in {func}"
    return ""


def start_line(
    *,
    impls: Mapping[str, str],
    device: str,
    seed: int,
    cases: int | None,
    budget: float | None,
    out: str,
    revision: str | None = None,
    release: str | None = None,
    resumed: Mapping[str, Any] | None = None,
    drawn: bool = False,
    notes: Sequence[str] = (),
) -> str:
    """The run's header; ``drawn``: the seed is a fresh one (say how to rerun it); ``notes``: what
    the run chose for the user (a default implementation that stands in for a missing one);
    ``release``: the vLLM release whose revision ``--revision auto`` picked."""
    limit = " / ".join(
        x
        for x in (
            plural(cases, "case") if cases is not None else "",
            f"{budget:.0f} s budget" if budget is not None else "",
        )
        if x
    )
    impl_text = ", ".join(f"{op}={ref}" for op, ref in impls.items())
    rev = f", contract revision {revision}" if revision else ""
    if revision and release:
        rev = f", vLLM {release}: revision {revision} (--revision auto)"
    again = ""
    if resumed is not None:
        again = (
            f"; resuming after {plural(int(resumed.get('cases', 0)), 'case')} and "
            f"{plural(int(resumed.get('findings', 0)), 'finding')}"
        )
    seed_text = f"seed {seed} (fresh: --seed {seed} reruns these cases)" if drawn else f"seed {seed}"
    note = "".join(f" ({n})" for n in notes)
    return (
        f"mlafuzz: fuzzing {impl_text}{note} on {device}, {seed_text}, {limit}{rev}{again};"
        f" findings -> {out}/findings.jsonl"
    )


def surface_line(view: Any) -> str:
    """One implementation's optional surfaces (kernels/external.py ``SurfaceView``): what it will
    be given, what not and why; for a signature that proves nothing (``**kwargs``, or none
    readable), what it will never be drawn and how to declare it."""
    who = f"{view.op}={view.impl}"
    given = ", ".join(f"{n} (declared)" if n in view.declared else n for n in view.given) or "none"
    absent = ", ".join(view.absent)
    if view.source == "opaque":
        never = [n for n in view.absent if n in view.declarable]
        if not never:
            return f"mlafuzz: {who}: given {given}"
        also = f"; given {given}" if view.given else ""
        return (
            f"mlafuzz: {who}: its signature (**kwargs, or none readable) names no optional keyword, so it"
            f" will never be drawn {', '.join(never)}{also}; if it takes them, declare them:"
            f" --features {view.op}={','.join(never)}"
        )
    why = "not declared by its registry entry" if view.source == "registry" else "not in its signature"
    return f"mlafuzz: {who}: given {given}" + (f"; not given: {absent} ({why})" if absent else "")


def budget_line(facts: Mapping[str, Any]) -> str:
    """How a budget run splits its budget (harness/drive/budget.py ``BudgetPlan.facts``)."""
    total, grace, reserve = float(facts["total"]), facts.get("grace"), float(facts.get("shrink") or 0.0)
    shrink = (
        f" ({total - reserve:g} s once a new finding waits: the last {reserve:g} s shrink it)" if reserve > 0 else ""
    )
    if grace is None:
        end = "; in-process, a case running then is not cut"
    else:
        end = (
            f"; a case still running then gets {float(grace):g} s more (the smaller of --timeout and"
            f" {float(facts['grace_cap']):g} s), then is cut and left unfinished for --resume"
        )
    return f"mlafuzz: budget {total:g} s: cases start until {total:g} s{shrink}{end}"


def cleared_line(*, out: str, removed: Sequence[str]) -> str:
    """The note that the default run folder's earlier run was cleared."""
    return (
        f"mlafuzz: cleared the earlier run in ./{out} ({', '.join(removed[:4])}"
        f"{', ...' if len(removed) > 4 else ''}); give --out DIR to keep runs, --resume to go on with one"
    )


def shrink_line(event: str, facts: Mapping[str, Any]) -> str:
    """The shrinking of one new bucket: its start, its progress, its end (see fuzz.shrink_and_bundle)."""
    if event == "start":
        kind, op, impl, cause = facts["bucket"]
        return (
            f"mlafuzz: shrinking bucket {facts['number']}/{facts['of']}: {kind} {op}={impl} cause={cause or '-'}"
            f" (budget {float(facts['budget']):g} s)"
        )
    size = ", ".join(f"{k} {v}" for k, v in (facts.get("size") or {}).items())
    if event == "step":
        return f"  ... {plural(facts['attempts'], 'attempt')}, {facts['accepted']} smaller so far: {size}"
    if facts.get("note"):
        return f"  not shrunk: {facts['note']} ({size})"
    how = "minimized" if facts.get("complete") else "budget spent; smallest so far"
    return (
        f"  {how}: {size} ({plural(facts['attempts'], 'attempt')}, {facts['accepted']} accepted,"
        f" {float(facts['seconds']):.1f} s)"
    )


def summary_line(s: Mapping[str, Any]) -> str:
    """summary.json's counts in one line (the fuzz run's last line, and the progress lines)."""
    ops = ", ".join(f"{op} {n}" for op, n in sorted((s.get("per_op") or {}).items()))
    kinds = ", ".join(f"{k} {n}" for k, n in sorted((s.get("by_kind") or {}).items()))
    rate = s.get("cases_per_second") or 0.0
    quarantined = s.get("quarantined") or []
    held = (
        f", {plural(len(quarantined), 'error-input class', 'error-input classes')} quarantined" if quarantined else ""
    )
    restarts = s.get("worker_restarts") or 0
    held += f", {plural(restarts, 'worker restart')}" if restarts else ""
    unfinished = len(s.get("unfinished") or ())
    held += f", {unfinished} unfinished (--resume runs them first)" if unfinished else ""
    ties = s.get("tie_hits") or 0
    held += f", bit-exact except {plural(int(ties), 'tie')} (--ties either)" if ties else ""
    return (
        f"mlafuzz: {plural(s.get('cases', 0), 'case')} ({ops or 'none'}), {plural(s.get('findings', 0), 'finding')}"
        f"{' (' + kinds + ')' if kinds else ''} in {plural(s.get('buckets', 0), 'bucket')},"
        f" {s.get('skipped', 0)} skipped{held},"
        f" {float(s.get('seconds', 0.0)):.1f} s ({rate:.1f} cases/s){' [interrupted]' if s.get('interrupted') else ''}"
    )


def skip_lines(s: Mapping[str, Any]) -> list[str]:
    """Why cases were skipped (summary.json's ``skip_reasons``), one line per reason, most first."""
    reasons = s.get("skip_reasons") or {}
    ranked = sorted(reasons.items(), key=lambda kv: (-int(kv[1]), kv[0]))
    return [f"mlafuzz: skipped {plural(int(n), 'case')}: {why}" for why, n in ranked]


def merge_lines(result: Any) -> list[str]:
    """What ``mlafuzz merge`` did (reports/merge ``MergeResult``): the dropped repeats, then the totals."""
    lines = [
        f"mlafuzz: merge: dropped {d.dir}: it repeats the cases of {d.kept} (seed {d.seed}, shard"
        f" {d.shard or '?'}, same ops and implementations)"
        for d in result.dropped
    ]
    s = result.summary
    lines.append(
        f"mlafuzz: merged {plural(result.shards, 'run directory', 'run directories')} into {result.out}:"
        f" {plural(s['cases'], 'case')}, {plural(s['findings'], 'finding')} in"
        f" {plural(s['buckets'], 'bucket')} ({plural(result.findings_lines, 'findings line')}"
        f"{', ' + plural(result.bundles, 'repro bundle') + ' in ' + str(result.out / 'bundles') if result.bundles else ''})"
        f"{' [partial]' if s.get('partial') else ''}"
    )
    return lines


def merge_warnings(result: Any) -> list[str]:
    """Why a merge's counts are not the whole run's, a line per reason (stderr): each missing
    shard, each shard without summary.json, each stopped shard."""
    s = result.summary
    shards = [r for r in s.get("shards") or () if isinstance(r, Mapping)]
    lines = []
    if s.get("missing_shards"):
        missing = ", ".join(s["missing_shards"])
        count = str(s["missing_shards"][0]).partition("/")[2]
        lines.append(
            f"mlafuzz: merge: warning: partial: shard {missing} of the run's {count} missing; the merged counts"
            " are not the whole run's (its report says incomplete)"
        )
    for r in shards:
        if not r.get("has_summary"):
            lines.append(
                f"mlafuzz: merge: warning: partial: {r.get('dir')} has no summary.json (killed or still running);"
                " counted from its findings lines"
            )
        elif r.get("interrupted"):
            lines.append(
                f"mlafuzz: merge: warning: {r.get('dir')} was stopped (Ctrl-C or SIGTERM) after"
                f" {plural(int(r.get('cases') or 0), 'case')}; its report says stopped"
            )
    return lines


def corpus_result_lines(outcomes: Iterable[Any]) -> list[str]:
    """A line per replayed corpus bundle (harness/drive/replay.py ``CorpusOutcome``): fixed, still
    failing (and as what), skipped, or not run because the run stopped first."""
    lines = []
    for o in outcomes:
        detail = {
            "still fails": f": {', '.join(o.kinds)}",
            "skipped": f": {o.why}",
            "not run": ": the run stopped first",
        }.get(o.status, "")
        lines.append(f"mlafuzz: --corpus: {o.bundle}: {o.status}{detail}")
    return lines


def bundle_lines(bundles: Iterable[Mapping[str, Any]]) -> list[str]:
    out = []
    for b in bundles:
        size = ", ".join(f"{k} {v}" for k, v in (b.get("size") or {}).items())
        out.append(f"  repro ({size}): {b.get('replay')}")
    return out


def stale_lines(stale: Iterable[Waiver]) -> list[str]:
    """One line per stale ledger entry, for stderr or a terminal summary."""
    return [
        f"mlafuzz: stale ledger entry {e.label()} ({e.issue}) matched no finding; remove it if fixed" for e in stale
    ]


def verdict_lines(judgement: Judgement, findings: Sequence[Finding]) -> list[str]:
    """The ledger's split of a run's findings, then one line per stale entry."""
    if judgement.ledger is None:
        return []
    failing = set(judgement.failing())
    expected = sum(1 for f in findings if judgement.statuses.get(f.dedup_key) == "expected")
    unexpected = sum(1 for f in findings if f.dedup_key in failing)
    head = (
        f"mlafuzz: ledger {judgement.ledger}: {plural(expected, 'expected finding')},"
        f" {unexpected} unexpected in {plural(len(failing), 'bucket')}"
    )
    elsewhere = [f"mlafuzz: ledger entry {e.label()}: {NOT_APPLICABLE}" for e in judgement.not_applicable]
    return [head, *stale_lines(judgement.stale), *elsewhere]


class MutantRow(Protocol):
    op: str
    name: str
    expected: str
    killed: bool
    found: tuple[str, ...]
    cases: int
    seconds: float
    size: str
    awaits: str | None


def _mutant_result(r: MutantRow) -> str:
    return "killed" if r.killed else "awaiting" if r.awaits else "SURVIVED"


MUTANTS_HEADER = f"{'mutant':<28} {'expected':<23} {'result':<9} {'kind found':<40} {'cases':>6} {'s':>6}  minimized"


def mutant_row(r: MutantRow) -> str:
    """One mutant's line of the table (printed as soon as that mutant is done)."""
    return (
        f"{r.name:<28} {r.expected:<23} {_mutant_result(r):<9} "
        f"{','.join(r.found) or '-':<40} {r.cases:>6} {r.seconds:>6.1f}  {r.size}"
    )


def mutants_table(results: Sequence[MutantRow]) -> list[str]:
    return [MUTANTS_HEADER, *(mutant_row(r) for r in results), *mutants_score(results)]


def mutants_score(results: Sequence[MutantRow]) -> list[str]:
    """The table's closing lines: the mutation score and the catalog marks to look at."""
    lines: list[str] = []
    killed = sum(r.killed for r in results)
    waiting = [r for r in results if not r.killed and r.awaits]
    lines.append(
        f"mutation score: {killed}/{len(results)} killed"
        f" ({100.0 * killed / len(results) if results else 0:.0f}%)"
        f"{f', {len(waiting)} awaiting inputs not drawn yet' if waiting else ''}"
    )
    lines += [f"  awaiting: {r.name} needs {r.awaits}" for r in waiting]
    lines += [
        f"  stale mark: {r.name} was killed although marked as awaiting {r.awaits}; drop the mark"
        for r in results
        if r.killed and r.awaits
    ]
    groups: dict[str, list[MutantRow]] = {}
    for r in results:  # a catalog family (getattr: a row type without groups has none)
        if getattr(r, "group", None):
            groups.setdefault(r.group, []).append(r)  # type: ignore[attr-defined]
    for name, rows in sorted(groups.items()):
        k = sum(r.killed for r in rows)
        lines.append(f"  group {name}: {k}/{len(rows)} killed ({100.0 * k / len(rows):.0f}% recall)")
    return lines


def replay_lines(
    *,
    op: str,
    impl_ref: str,
    device: str,
    recorded: Finding,
    found: Sequence[tuple[Finding, bool]],
    revision: str | None = None,
) -> list[str]:
    where = f"{device}, contract revision {revision}" if revision else device
    if not found:
        return [
            f"mlafuzz replay: passes on {op}={impl_ref} ({where}); the bundle recorded "
            f"{recorded.kind.value}: {recorded.message}"
        ]
    lines = []
    for f, same in found:
        lines.append(
            f"mlafuzz replay: {'reproduces' if same else 'other finding'}: {f.kind.value} {f.op}={f.impl}: {f.message}"
        )
        if f.kind is Kind.EXCEPTION:  # the implementation's own frames (harness frames dropped)
            lines += [f"  {line}" for line in f.extra.get("traceback") or ()]
    return lines


def rerun_command(
    *,
    op: str,
    impl: str,
    device: str,
    seed: int,
    cases: int,
    shard: tuple[int, int] | None,
    out: str,
    features: Sequence[str] = (),
) -> str:
    """A re-run of exactly a run's cases (case i is a pure function of seed and i); ``features``:
    the surfaces the run declared the implementation takes (its cases drew them)."""
    parts = [
        "fuzz",
        "--op",
        op,
        "--impl",
        f"{op}={impl}",
        "--device",
        device,
        "--seed",
        str(seed),
        "--cases",
        str(cases),
    ]
    if shard is not None and shard[1] > 1:
        parts += ["--shard", f"{shard[0]}/{shard[1]}"]
    if features:
        parts += ["--features", f"{op}={','.join(features)}"]
    parts += ["--out", out]
    return command(*parts)


def plugin_failure(
    *,
    title: str,
    summary: Mapping[str, Any],
    buckets: Sequence[Bucket],
    shown: int,
    replay_for: Any,
    findings_path: str,
    run_dir: str,
) -> str:
    """A failing pytest item's text: the first ``shown`` buckets, each with its replay command."""
    lines = [title, summary_line(summary)]
    counts = bucket_counts(summary)
    for b in buckets[:shown]:
        f = b.first
        n = max(counts.get(b.key, 0), b.count)
        lines += [
            "",
            f"{b.kind} cause={b.cause or '-'} ({plural(n, 'finding')}), first case {f.case_id}:",
            f"  {f.message}",
        ]
        lines += [f"  at {list(m.index)}: expected {m.expected}, got {m.actual}" for m in f.mismatches[:3]]
        lines.append(f"  replay: {replay_for(b)}")
    if len(buckets) > shown:
        lines.append(f"... {plural(len(buckets) - shown, 'more bucket')}")
    html = command("report", run_dir, "--format", "html", "-o", "report.html")
    lines.append(f"findings: {findings_path}  ({html})")
    return "\n".join(lines)


def findings_table(
    findings: Iterable[Finding],
    judgement: Judgement,
    *,
    bundles: list | None = None,
    max_rows: int = 30,
    summary: Mapping[str, Any] | None = None,
) -> list[str]:
    """A plain table of buckets (failures first) with their replay commands: the end of a run.
    ``summary``: the run's summary.json, whose bucket counts the ``n`` column shows."""
    buckets = group_buckets(findings, judgement, bucket_counts(summary or {}))
    if not buckets:
        return ["mlafuzz: no findings"]
    lines = [f"{'status':<9} {'kind':<23} {'op':<8} {'impl':<24} {'cause':<28} {'n':>5}  first message"]
    for b in buckets[:max_rows]:
        lines.append(
            f"{b.status:<9} {b.kind:<23} {b.op:<8} {b.impl[:24]:<24} {(b.cause or '-')[:28]:<28}"
            f" {b.count:>5}  {' '.join(b.first.message.split())[:120]}"
        )
    if len(buckets) > max_rows:
        lines.append(f"... {plural(len(buckets) - max_rows, 'more bucket')}")
    for b in buckets[:max_rows]:
        cmd = replay_command(b.first, bundles=bundles)
        if cmd and b.is_failure:
            lines.append(f"replay {b.kind} {b.op} {b.cause}: {cmd}")
    return lines
