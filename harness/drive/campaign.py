"""One campaign: the run every front end asks for (``mlafuzz fuzz``, the pytest plugin, ``bench
--fuzz``, ``mutants``), assembled in one place.

A front end parses its own arguments into a ``Campaign`` and calls ``run_campaign``, which
resolves, loads and signature-checks each implementation once (``select_impls``), picks the
workers and their devices, starts the cold-start build of our CUDA extension, builds the
executor, settles the run folder (resumed, or an earlier run cleared), runs the fuzz loop (which
shrinks and bundles each new bucket) and judges. What it found comes back as a
``CampaignResult``; each front end reports it its own way (lines, pytest items, rates, a
mutation table). A user mistake is a ``CampaignError``: one line, which the CLI makes exit 2 and
the plugin a usage error or a failed item.

Also here: a CI job's shard of the case space, read from the variables its CI sets
(``--shard auto``, the plugin). Buildkite's ``parallelism: N`` runs N copies with
BUILDKITE_PARALLEL_JOB (0-based) and BUILDKITE_PARALLEL_JOB_COUNT; a GitHub Actions matrix (or
any CI) sets MLAFUZZ_SHARD=K/N itself.

Nothing heavy is imported at module level: the CLI's argument types read the shard from here,
and ``mlafuzz --help`` answers at once.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from mlafuzz.reports.invocation import command

if TYPE_CHECKING:
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.fuzz import FuzzConfig, FuzzSummary
    from mlafuzz.harness.drive.resume import Resume
    from mlafuzz.harness.drive.workers import Executor
    from mlafuzz.harness.ledger import Judgement
    from mlafuzz.kernels.entry import ImplEntry

# CI systems that split one job into N parallel copies: (index variable, count variable).
CI_SHARD_VARIABLES = (("BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT"),)
SHARD_VARIABLE = "MLAFUZZ_SHARD"  # generic K/N (a GitHub Actions matrix sets it per job)
DEFAULT_TIMEOUT = 120.0
AUTO = "auto"  # --revision auto: the revision of the installed vLLM's release (revisions.TABLE.releases)


class ShardError(ValueError):
    """A malformed K/N (from the command line or a variable): one line."""


class CampaignError(ValueError):
    """A user mistake in what a campaign asks for (an --impl, a device, a run folder): one line."""


def parse_shard(text: str, *, what: str = "") -> tuple[int, int]:
    """'K/N' with 0 <= K < N, as (K, N); ``what`` names where it came from in the error."""
    k, sep, n = text.partition("/")
    try:
        index, count = int(k), int(n)
    except ValueError:
        index = count = -1
    if not sep or not (count >= 1 and 0 <= index < count):
        raise ShardError(f"expected K/N with 0 <= K < N, got {what}{text!r}")
    return index, count


def shard_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, int, str]:
    """(K, N, the variable it came from): MLAFUZZ_SHARD=K/N first (the user's own word), then
    Buildkite's pair, else (0, 1, ''). A malformed value raises ShardError naming the variable: a
    CI copy must not silently fuzz the wrong slice."""
    env = os.environ if environ is None else environ
    text = env.get(SHARD_VARIABLE, "").strip()
    if text:
        k, n = parse_shard(text, what=f"{SHARD_VARIABLE}=")
        return k, n, SHARD_VARIABLE
    for index_var, count_var in CI_SHARD_VARIABLES:
        index, count = env.get(index_var, "").strip(), env.get(count_var, "").strip()
        if index or count:
            k, n = parse_shard(f"{index or '?'}/{count or '?'}", what=f"{index_var}/{count_var}=")
            return k, n, index_var
    return 0, 1, ""


@dataclass(frozen=True, kw_only=True)
class Campaign:
    """What to run: the front ends' options, parsed and checked for type, not yet resolved."""

    ops: tuple[str, ...]
    impls: tuple[str, ...] = ()  # --impl OP=REF texts as the user gave them; an op without one: its default here
    device: str = "cpu"
    cases: int | None = None
    budget: float | None = None
    seed: int = 0
    out_dir: Path = Path("mlafuzz-out")
    knobs: Any = None  # generators.draw.Knobs; None: FuzzConfig's default
    ulp: int = 0
    fixed_spec: Any = None
    shard: tuple[int, int] = (0, 1)
    part: tuple[int, int] = (0, 1)  # (k, parts): part k of the shard and of its cases (the plugin's items under xdist)
    shrink_budget: float = 0.0
    rejects: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    features: tuple[str, ...] = ()  # --features OP=NAME,... texts: optional surfaces a wrapper takes
    revision: str | None = None  # a revision, or AUTO; None: AUTO when an implementation is vllm, else the newest
    timeout: float | None = DEFAULT_TIMEOUT  # per case, in worker processes (None: none recorded)
    isolate: bool = True  # cases in worker processes; False: in this process (a crash ends the run)
    workers: int | None = None  # None: the device's rule (workers.slot_plan)
    slots: tuple[str, ...] = ()  # the workers' devices when the caller pins them (the plugin's GPU)
    redzone: bool = False
    sanitizer: bool = False
    resume: bool = False  # go on with the run in out_dir; else an earlier run there is cleared
    corpus: Path | None = None  # repro bundles replayed first
    ledger: Any = None  # harness.ledger.Ledger: the findings it expects don't fail the run
    max_findings: int | None = None


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """What a campaign settled before its first case: told to ``on_start``."""

    config: FuzzConfig
    resume: Resume | None
    removed: list[str]  # an earlier run's files cleared from out_dir
    corpus: list  # the corpus's tasks, run first
    corpus_notes: list[str]  # one per bundle left out of the corpus
    surfaces: tuple = ()  # kernels.external.SurfaceView per implementation whose op has optional surfaces
    corpus_names: Mapping[int, str] = field(default_factory=dict)  # corpus task index -> its bundle's name
    ready: Callable[[str], bool] | None  # the fuzz loop's: an op waits while the extension it needs builds


@dataclass(frozen=True, kw_only=True)
class CampaignResult:
    config: FuzzConfig
    summary: FuzzSummary
    found: list  # every finding of the run (a resumed run's earlier ones first)
    judgement: Judgement
    corpus: tuple = ()  # replay.CorpusOutcome per corpus bundle: fixed, still fails, ...

    @property
    def impls(self) -> Mapping[str, str]:
        return self.config.impls


def declared_features(
    texts: tuple[str, ...] | list[str], ops: list[str] | tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """--features OP=NAME,... -> op -> the optional surfaces declared (kernels/external.py
    ``SURFACES``); a bad op or name, or an op this run does not fuzz, is one line (CampaignError)."""
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.kernels.external import parse_features

    try:
        return parse_features(texts, ops=ops)
    except ImplError as exc:
        raise CampaignError(str(exc)) from None


def select_impls(
    session: Session,
    texts: tuple[str, ...] | list[str] | None,
    ops: list[str],
    device: str,
    *,
    features: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, str]:
    """op -> --impl reference, each resolved and loaded once here (its signature checked against
    the op's call, and against the surfaces ``features`` declares for it) so mistakes surface as
    one line (CampaignError) before any worker starts."""
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.kernels.external import cannot_take
    from mlafuzz.kernels.registry import parse_impl_arg

    chosen: dict[str, str] = {}
    refs = {}
    try:
        for text in texts or ():
            op, ref = parse_impl_arg(text, ops=session.table.names)
            if op not in ops:
                raise ImplError(f"--impl {text}: op {op!r} is not fuzzed in this run (ops: {', '.join(ops)})")
            if chosen.get(op, ref) != ref:  # a run fuzzes one implementation per op: never drop one silently
                raise ImplError(
                    f"--impl {op}={chosen[op]} and --impl {text}: a run fuzzes one implementation per op;"
                    f" fuzz each in its own run (its own --out), or both at once with the pytest plugin"
                )
            chosen[op] = ref
        for op in ops:
            ref = chosen.get(op) or session.default_ref(op, device)
            declared = (features or {}).get(op, ())
            fn = load(session, session.entry(op, ref, features=declared), device)
            refused = cannot_take(op, fn, declared)
            if refused:
                name, keywords = refused[0]
                raise ImplError(
                    f"--features {op}={','.join(declared)}: {op}={ref} cannot take {name}: its signature"
                    f" has no {' / '.join(keywords)} parameter and no **kwargs (drop {name} from --features)"
                )
            refs[op] = ref
    except ImplError as exc:
        raise CampaignError(str(exc)) from None
    return refs


def settle_revision(asked: str | None, impls: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(the revision the run is judged under, the vLLM release it follows): ``asked`` as given;
    AUTO, or nothing asked while an implementation is vLLM's, the revision of the installed vLLM's
    release (MLAFUZZ_VLLM_VERSION wins); else (None, None), the newest. An unknown release is
    one line (CampaignError) naming the known ones."""
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.kernels.vllm import installed_version
    from mlafuzz.oracles import revisions

    if asked not in (None, AUTO):
        return asked, None
    if asked is None and "vllm" not in impls.values():
        return None, None
    try:
        version = installed_version()
        return revisions.for_release(version), version
    except (ImplError, revisions.ReleaseError) as exc:
        raise CampaignError(f"--revision auto: {exc}") from None


def load(session: Session, entry: ImplEntry, device: str) -> Callable:
    """Load ``entry`` once (the session keeps it); any failure as one line (ImplError)."""
    from mlafuzz.kernels.entry import ImplError

    try:
        return session.load(entry, device)
    except ImplError:
        raise
    except Exception as exc:  # e.g. the CUDA extension failed to build: one line, exit 2
        text = str(exc).strip()
        raise ImplError(
            f"--impl {entry.op}={entry.name}: cannot load on {device}: {type(exc).__name__}: "
            f"{text.splitlines()[0] if text else ''}"
        ) from None


def cache_folders(environ: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(variable, folder, what it holds) for each cache a run fills, as the variable (or the
    tool's default when unset) says; nothing is imported or created. A CI job keeps them."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    triton_home = Path(env.get("TRITON_HOME") or home)
    triton = env.get("TRITON_CACHE_DIR") or str(triton_home / ".triton" / "cache")
    mlafuzz = env.get("MLAFUZZ_CACHE") or str(home / ".cache" / "mlafuzz")
    xdg = Path(env.get("XDG_CACHE_HOME") or home / ".cache")  # torch's appdirs default
    torch_ext = env.get("TORCH_EXTENSIONS_DIR") or str(xdg / "torch_extensions")
    return [
        ("TRITON_CACHE_DIR", triton, "Triton's compiled kernels: fused generation, fast-path checks, Triton impls"),
        ("MLAFUZZ_CACHE", mlafuzz, "mlafuzz's CUDA extension builds (and its small host helpers)"),
        ("TORCH_EXTENSIONS_DIR", torch_ext, "torch's JIT extensions: an --impl that builds itself with cpp_extension"),
    ]


def needs_extension(entries: Mapping[str, ImplEntry]) -> bool:
    """Whether a run of these implementations (op -> entry) calls our CUDA extension: the entry's
    own fact (``ImplEntry.extension``)."""
    return any(e.extension for e in entries.values())


def start_builds(
    *, device: str, entries: Mapping[str, ImplEntry], say: Callable[[str], None]
) -> tuple[threading.Thread, dict[str, Any]] | None:
    """On a GPU whose CUDA extension is not built yet and a run that needs it: its build in a
    background thread, with a line now and one when it is done (``say``); a line too when Triton's
    cache is empty (its compiles happen in the workers, as cases meet them). Returns (thread,
    outcome: 'info' or 'error') or None when there is nothing to build."""
    if device.split(":")[0] != "cuda":
        return None
    triton = Path(cache_folders()[0][1])
    if not (triton.is_dir() and any(triton.iterdir())):
        say(
            f"Triton's cache {triton} is empty: each kernel variant compiles when a case first needs it"
            f" (about 1 s each, in every worker at once); `{command('warmup')}` compiles them ahead"
        )
    if not needs_extension(entries):
        return None
    from mlafuzz.kernels import cuda_ext

    if cuda_ext.extension_built():
        return None
    outcome: dict[str, Any] = {}
    start = time.monotonic()
    say(
        f"building the CUDA extension {cuda_ext.EXTENSION_NAME} in the background (first run here;"
        f" ops that need it wait for it, the others start now; `{command('warmup')}` builds it ahead)"
    )

    def done(info: Any, error: BaseException | None) -> None:
        outcome.update(info=info, error=error, seconds=time.monotonic() - start)
        if error is not None:
            say(f"the CUDA extension did not build: {type(error).__name__}: {first_line(error)}")
        else:
            say(f"built the CUDA extension in {outcome['seconds']:.1f} s ({info.arch}, {info.path.parent})")

    return cuda_ext.build_in_background(done), outcome


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def built_or_not_needed(thread: threading.Thread, entries: Mapping[str, ImplEntry]) -> Callable[[str], bool]:
    """The fuzz loop's ``ready(op)`` while ``thread`` builds the extension: an op whose
    implementation needs it waits (its cases go later, in order), the others start now."""

    def ready(op: str) -> bool:
        entry = entries.get(op)
        return not thread.is_alive() or entry is None or not entry.extension

    return ready


def build_executor(
    campaign: Campaign, session: Session, *, table_ref: str, on_workers: Callable[[str], None] | None = None
) -> Executor:
    """The run's executor: the sanitizer's, this process, or worker processes on the campaign's
    slots (else the device's rule: ``slot_plan``, whose line ``on_workers`` hears)."""
    from mlafuzz.harness.drive.workers import InProcess, WorkerPool, device_slots, slot_plan

    if campaign.sanitizer:
        from mlafuzz.harness.drive.sanitizer import SanitizerExecutor

        try:
            return SanitizerExecutor(device=campaign.device)
        except RuntimeError as exc:
            raise CampaignError(str(exc)) from None
    if not campaign.isolate:  # the redzone's allocator goes with a session of its own
        return InProcess(redzone=True) if campaign.redzone else InProcess(session=session)
    slots = list(campaign.slots)
    if not slots:
        plan = slot_plan(device=campaign.device, workers=campaign.workers, knobs=campaign.knobs)
        slots = device_slots(device=campaign.device, workers=campaign.workers, plan=plan)
        if on_workers is not None:
            on_workers(plan.line(slots))
    return WorkerPool(
        devices=slots, timeout=campaign.timeout or DEFAULT_TIMEOUT, redzone=campaign.redzone, table_ref=table_ref
    )


def fuzz_config(campaign: Campaign, session: Session) -> FuzzConfig:
    """The fuzz loop's configuration, its implementations resolved and loaded (``select_impls``)."""
    from mlafuzz.harness.check.compare import Policy
    from mlafuzz.harness.drive.fuzz import FuzzConfig, Shard
    from mlafuzz.harness.ledger import ledger_record

    if (campaign.redzone or campaign.sanitizer) and campaign.device.split(":")[0] != "cuda":
        raise CampaignError("--redzone and --sanitizer check GPU memory: use them with --device cuda")
    features = declared_features(campaign.features, campaign.ops)
    k, parts = campaign.part
    impls = select_impls(session, campaign.impls, list(campaign.ops), campaign.device, features=features)
    revision, release = settle_revision(campaign.revision, impls)
    optional = {"revision": revision, "knobs": campaign.knobs, "release": release}
    config = FuzzConfig(
        ops=campaign.ops,
        impls=impls,
        features=features,
        device=campaign.device,
        cases=campaign.cases,
        budget=campaign.budget,
        seed=campaign.seed,
        out_dir=Path(campaign.out_dir),
        policy=Policy(ulp=campaign.ulp),
        fixed_spec=campaign.fixed_spec,
        shard=Shard(index=campaign.shard[0], count=campaign.shard[1]).part(k, parts),
        shrink_budget=campaign.shrink_budget,
        rejects=campaign.rejects,
        table=session.table,
        timeout=campaign.timeout if campaign.isolate and not campaign.sanitizer else None,
        ledger=ledger_record(campaign.ledger),
        **{name: v for name, v in optional.items() if v is not None},
    )
    if campaign.cases is None or parts == 1:
        return config
    # --cases N counts the shard's cases: each part runs its own share of the shard's first N.
    return dataclasses.replace(config, cases=Shard.part_cases(campaign.cases, size=config.mix.size, k=k, parts=parts))


def prepare(campaign: Campaign, session: Session, *, say: Callable[[str], None] | None = None) -> Prepared:
    """What is settled before the first case: implementations loaded, the corpus read
    (before the folder is cleared: it may be the last run's own bundles), the cold-start build
    started, the run folder resumed or cleared."""
    from mlafuzz.harness.drive.resume import ResumeError, load_resume
    from mlafuzz.reports.rundir import clear_run, holds_run

    config = fuzz_config(campaign, session)
    corpus, notes, names = [], [], {}
    if campaign.corpus is not None:
        from mlafuzz.harness.drive.replay import corpus_tasks
        from mlafuzz.reports.bundle import BundleError

        try:
            corpus, notes, names = corpus_tasks(
                Path(campaign.corpus),
                impls=config.impls,
                device=config.device,
                ulp=config.policy.ulp,
                revision=config.revision,
                rejects=config.rejects,
                shard=(config.shard.index, config.shard.count),
                features=config.features,
            )
        except BundleError as exc:
            raise CampaignError(f"--corpus {campaign.corpus}: {exc}") from None
    from mlafuzz.kernels.external import surface_view

    entries = {op: session.entry(op, ref, features=config.features.get(op, ())) for op, ref in config.impls.items()}
    views = tuple(v for v in (surface_view(e) for e in entries.values()) if v is not None)
    build = start_builds(device=campaign.device, entries=entries, say=say or (lambda line: None))
    resume, removed = None, []
    if campaign.resume and holds_run(config.out_dir):
        try:
            resume = load_resume(config.out_dir, config.run_json())
        except ResumeError as exc:
            raise CampaignError(str(exc)) from None
    else:
        removed = clear_run(config.out_dir)
    ready = None if build is None else built_or_not_needed(build[0], entries)
    return Prepared(
        config=config,
        resume=resume,
        removed=removed,
        corpus=corpus,
        corpus_notes=notes,
        corpus_names=names,
        ready=ready,
        surfaces=views,
    )


def run_campaign(
    campaign: Campaign,
    *,
    session: Session | None = None,
    executor: Executor | None = None,
    table_ref: str | None = None,
    say: Callable[[str], None] | None = None,
    on_start: Callable[[Prepared], None] | None = None,
    on_workers: Callable[[str], None] | None = None,
    on_finding: Callable[[Any], None] | None = None,
    on_progress: Callable[[dict[str, Any], float], None] | None = None,
    on_shrink: Callable[[str, dict[str, Any]], None] | None = None,
    stop_when: Callable[[FuzzSummary], bool] | None = None,
    started: float | None = None,
) -> CampaignResult:
    """Resolve, load, build, run, shrink and judge ``campaign``. ``session``: the process's (its
    loaded implementations are kept); ``executor``: one the caller keeps warm across campaigns
    (it is not closed here), else one built for this campaign and closed when it ends. ``say``
    hears the cold-start build's lines, ``on_start`` what was settled before the first case,
    ``on_workers`` the worker line of a pool built here; ``started``: when the budget's clock
    started (``time.monotonic()``; default: the fuzz loop's start); the rest are the fuzz loop's
    hooks."""
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.fuzz import fuzz
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref
    from mlafuzz.harness.ledger import judge

    table_ref = table_ref or DEFAULT_TABLE
    session = session if session is not None else Session(table=table_from_ref(table_ref))
    prepared = prepare(campaign, session, say=say)
    config, resume = prepared.config, prepared.resume
    if on_start is not None:
        on_start(prepared)
    found: list = list(resume.findings) if resume is not None else []  # the verdict is the whole run's

    def record(finding: Any) -> None:
        found.append(finding)
        if on_finding is not None:
            on_finding(finding)

    if max_findings_stop := _stop_after(campaign.max_findings):
        stop_when = max_findings_stop if stop_when is None else _either(stop_when, max_findings_stop)
    built = (
        None if executor is not None else build_executor(campaign, session, table_ref=table_ref, on_workers=on_workers)
    )
    runner: Any = executor if executor is not None else built
    corpus = None
    try:
        if prepared.corpus:
            from mlafuzz.harness.drive.replay import CorpusFirst

            runner = corpus = CorpusFirst(runner, prepared.corpus, prepared.corpus_names)
        summary = fuzz(
            config,
            executor=runner,
            on_finding=record,
            on_progress=on_progress,
            stop_when=stop_when,
            resume=resume,
            on_shrink=on_shrink,
            ready=prepared.ready,
            started=started,
        )
    finally:
        if built is not None:
            built.close()
    judgement = judge(found, ledger=campaign.ledger, ran=config.impls.items())
    outcomes = tuple(corpus.outcomes()) if corpus is not None else ()
    return CampaignResult(config=config, summary=summary, found=found, judgement=judgement, corpus=outcomes)


def _stop_after(max_findings: int | None) -> Callable[[FuzzSummary], bool] | None:
    """fuzz()'s ``stop_when`` for --max-findings: N error buckets, this session's and a resumed
    run's earlier ones together."""
    if max_findings is None:
        return None
    return lambda summary: len(set(summary.buckets) | summary.known) >= max_findings


def _either(a: Callable[[Any], bool], b: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda summary: a(summary) or b(summary)
