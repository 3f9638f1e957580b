"""Run one case through one implementation and its oracle, inside guards.

Two paths, the same findings:

- The full path (CPU, and any case the fast path flags): a case runs once, or
  twice when its outputs are guarded (the two-pattern write map needs both
  runs) or a re-run is sampled; the vectorized oracle and the comparator judge
  the first run's outputs, the guards and the input copies the rest. The second
  run doubles as the nondeterminism check, compared bit for bit with the first.
- The fast path (GPU): one run (two when a re-run is sampled) into guarded
  outputs prefilled so that no byte holds its expected value, then the op's
  fused check, the guard zones and the inputs, all read as device flags in one
  host sync. All clear means exactly what the full path would conclude with no
  finding; any raised flag sends the case to the full path for the exact
  finding. Should the full path then find nothing, what the fast path saw
  happened in one run only: NONDETERMINISM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness import redzone
from mlafuzz.harness.bits import as_bits, differ_flag, same_bits, word_view
from mlafuzz.harness.compare import Context, Policy, compare
from mlafuzz.harness.findings import Finding, Kind, Severity
from mlafuzz.harness.fingerprint import Snapshot, add_words
from mlafuzz.harness.guards import PATTERNS, Guarded, oob_findings, untouched_zones, write_map_findings
from mlafuzz.harness.ops import OP_DEFS, OpDef
from mlafuzz.kernels.registry import ImplEntry


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    case_id: str
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None  # why the case was not run (a capability the impl lacks)
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Call:
    """One call of the implementation: what it returned, what it was given, or how it failed."""

    outputs: Mapping[str, Any] | None
    inputs: Mapping[str, Any]
    guards: Mapping[str, Guarded]
    error: BaseException | None
    redzone: tuple = ()  # red-zone violations seen right after the call (GPU fast mode)
    prefilled: bool = False  # the guarded outputs were prefilled by the op's fast_prefill


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def call_impl(*, opdef: OpDef, fn: Callable, case: Case, fill: int,
              reuse: Mapping[str, Any] | None = None, prefill: bool = False, share: bool = False,
              wait: bool = True) -> Call:
    """One call on fresh copies of the case's inputs; ``reuse``: inputs of an earlier call,
    passed again instead of copied; ``share``: views of the case's own tensors instead of
    copies, for a caller that checks them by fingerprint (the ops' in-place inputs are always
    fresh copies). ``prefill``: fill the guarded outputs with the op's fast_prefill (pattern
    ``fill`` where it cannot; ``Call.prefilled`` says which). ``wait=False``: no device sync after
    the call (an asynchronous kernel error then surfaces at the caller's next sync; red-zone
    checks always sync)."""
    if share:  # views: the impl can change their data (the fingerprints see it), not the case's tensor objects
        reuse = {k: v.view(v.shape) for k, v in case.tensors.items() if v is not None and k not in opdef.inplace}
    keep = {k: v for k, v in (reuse or {}).items() if k in case.tensors and k not in opdef.inplace}
    inputs = {**case.cloned_tensors(skip=keep.keys()), **keep}
    guards: dict[str, Guarded] = {}
    prefilled = False
    if opdef.guarded:
        prefill = prefill and opdef.fast_prefill is not None
        guards = opdef.guarded(case, fill, fill_region=not prefill)
        if prefill:
            prefilled = _quietly(lambda: opdef.fast_prefill(case, guards), case.op, False)
            if not prefilled:
                for g in guards.values():
                    g.region().fill_(g.fill)
    args = {**inputs, **{k: g.view for k, g in guards.items()}}
    rz = redzone.active()
    if rz is not None:
        rz.check()  # start clean: only this call's writes count
    try:
        outputs = opdef.invoke(fn, case, args)
        if wait or rz is not None:
            sync(case.device)
    except Exception as exc:  # a refusal or a failure: the caller decides which it is
        return Call(outputs=None, inputs=inputs, guards=guards, error=exc,
                    redzone=tuple(rz.check()) if rz is not None else (), prefilled=prefilled)
    return Call(outputs=outputs, inputs=inputs, guards=guards, error=None,
                redzone=tuple(rz.check()) if rz is not None else (), prefilled=prefilled)


def redzone_findings(call: Call, ctx: Context) -> list[Finding]:
    """OOB_WRITE for red-zone canaries the call changed, named by the tensor they guard."""
    names = {}
    for name, t in {**call.inputs, **(call.outputs or {})}.items():
        if isinstance(t, torch.Tensor) and t.is_cuda:
            names[t.data_ptr()] = name
    out = []
    for v in call.redzone:
        name = names.get(v.ptr, f"an allocation of {v.size} bytes")
        out.append(Finding(kind=Kind.OOB_WRITE, op=ctx.op, impl=ctx.impl, case_id=ctx.case_id, tensor=names.get(v.ptr),
                           cause=f"{names.get(v.ptr, 'alloc')}:oob_{v.side}", count=v.count,
                           message=f"{name}: {v.count} bytes written {v.side} it (nearest {v.offset} bytes "
                                   f"{'before its start' if v.side == 'before' else 'past its end'}; "
                                   f"red-zone allocator)"))
    return out


def input_mutations(case: Case, inputs: Mapping[str, Any], ctx: Context) -> list[Finding]:
    out = []
    for name, before in case.tensors.items():
        after = inputs.get(name)
        if before is None or after is None or name in OP_DEFS[case.op].inplace:
            continue
        if not same_bits(before, after):
            changed = int((as_bits(before) != as_bits(after)).sum())
            out.append(Finding(kind=Kind.INPUT_MUTATION, op=ctx.op, impl=ctx.impl, case_id=ctx.case_id,
                               tensor=name, cause=f"{name}:mutated", count=changed, total=as_bits(before).numel(),
                               message=f"input {name} changed during the call ({changed} elements)"))
    return out


def _rerun_pairs(first: Call, second: Call) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, first run's, second run's) of each output the impl allocated, alike in shape and
    dtype: the ones whose bits a re-run is held to (guarded outputs answer to the write map)."""
    for name, a in (first.outputs or {}).items():
        b = (second.outputs or {}).get(name)
        if (name not in first.guards and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype):
            yield name, a, b


def _rerun_differs(first: Call, second: Call, ctx: Context) -> list[Finding]:
    """Nondeterminism of outputs the impl allocated (guarded ones use the write map)."""
    out = []
    for name, a, b in _rerun_pairs(first, second):
        if not same_bits(a, b):
            n = int((as_bits(a) != as_bits(b)).sum())
            out.append(Finding(kind=Kind.NONDETERMINISM, op=ctx.op, impl=ctx.impl, case_id=ctx.case_id,
                               tensor=name, cause=f"{name}:rerun", count=n, total=as_bits(a).numel(),
                               message=f"{name}: a second run of the same case differs in {n} elements"))
    return out


def _review(opdef: OpDef, case: Case, call: Call, findings: list[Finding], ctx: Context) -> list[Finding]:
    """The op's own re-filing of the first call's findings (e.g. metadata -> METADATA_MISMATCH)."""
    return list(opdef.review(case, call, findings, ctx)) if opdef.review else findings


def _quietly(fn: Callable[[], Any], op: str, default: Any) -> Any:
    """One step of the fast path; a failure of the step itself (not of the implementation under
    test) must never become a finding or a crash: it means "take the full path"."""
    try:
        return fn()
    except Exception as exc:
        if op not in _FAST_FAILED:
            _FAST_FAILED.append(op)
            warnings.warn(f"fast check for {op} failed ({first_line(exc)}); using the full oracle",
                          RuntimeWarning, stacklevel=3)
        return default


_FAST_FAILED: list[str] = []  # warn once per op and process


_STAGES: dict[str, float] | None = None  # set by timed_stages() (mlafuzz bench --harness)


def _stage(name: str, device: str) -> ContextManager[None]:
    """Adds the (device-synchronized) seconds of the block to stage ``name`` while a
    ``timed_stages()`` is open; otherwise does nothing (a shared null context: the fast path
    enters several per case, and a generator-based one costs a few us each)."""
    return _NULL if _STAGES is None else _timed_stage(name, device)


_NULL = contextlib.nullcontext()


@contextlib.contextmanager
def _timed_stage(name: str, device: str) -> Iterator[None]:
    sync(device)
    t0 = time.perf_counter()
    yield
    sync(device)
    _STAGES[name] += time.perf_counter() - t0


@contextlib.contextmanager
def timed_stages() -> Iterator[dict[str, float]]:
    """Seconds per stage of the check_calls made inside the block: run (first call: copying
    inputs, filling guarded outputs, the kernel), inputs, rerun, oracle (the fused check, or
    oracle + comparator), guards (guard zones and write map)."""
    global _STAGES
    _STAGES = defaultdict(float)
    try:
        yield _STAGES
    finally:
        _STAGES = None


def check_call(*, case: Case, entry: ImplEntry, fn: Callable, policy: Policy, rerun: bool,
               oracle: Callable[[Case], Mapping[str, Any]] | None = None, fast: bool | None = None) -> list[Finding]:
    """Findings of one case (see the module docstring for the two paths). ``fast``: take the
    fast path where the op has one (default: on the GPU only; under Triton's CPU interpreter it
    is slower than the oracle); an explicit ``oracle`` always takes the full path."""
    opdef = OP_DEFS[case.op]
    ctx = Context(op=case.op, impl=entry.name, case_id=case.case_id)
    if fast is None:
        fast = case.device.startswith("cuda")
    seen = ""
    # The fused checks are bit-exact: with a ulp tolerance the comparator judges every case (a
    # fused "differs" the full path then accepts would read as nondeterminism).
    if fast and oracle is None and opdef.fast_check is not None and policy.ulp == 0:
        clear, seen, found = _fast_path(opdef=opdef, case=case, entry=entry, fn=fn, rerun=rerun)
        if clear:
            return []
        if found is not None:
            return found
    findings = _full_path(opdef=opdef, case=case, entry=entry, fn=fn, policy=policy, rerun=rerun, oracle=oracle,
                          ctx=ctx)
    if seen and not any(f.severity is Severity.ERROR for f in findings):
        findings.append(Finding(kind=Kind.NONDETERMINISM, op=case.op, impl=entry.name, case_id=case.case_id,
                                cause="not_reproduced",
                                message=f"the implementation {seen} in one check of this case; the full "
                                        "check's runs right after did not reproduce it: the result changes "
                                        "from run to run"))
    return findings


def _snapshot(opdef: OpDef, case: Case) -> Snapshot:
    """The fingerprints of the case's inputs before any call, taken once per case."""
    if "inputs_snapshot" not in case.memo:
        case.memo["inputs_snapshot"] = Snapshot(
            {k: v for k, v in case.tensors.items() if v is not None and k not in opdef.inplace}, device=case.device)
    return case.memo["inputs_snapshot"]


def _restore(case: Case, snap: Snapshot) -> bool:
    """Rebuild the case's input tensors in place from its spec and seed (a call changed them) and
    say whether they hold what they held before, fingerprints and copies agreeing."""
    from mlafuzz.generators.materialize import materialize

    try:
        fresh = materialize(case.spec, case.seed, case.device)
    except Exception:  # a hand-built case: nothing to rebuild it from
        return False
    for name in snap.names:
        t, f = case.tensors[name], fresh.tensors.get(name)
        if f is None or f.shape != t.shape or f.dtype != t.dtype:
            return False
        t.copy_(f)
    return not snap.changed()


def _fast_path(*, opdef: OpDef, case: Case, entry: ImplEntry, fn: Callable,
               rerun: bool) -> tuple[bool, str, list[Finding] | None]:
    """(True, "", None) when every check of the case passed; else (False, what was seen, None)
    when the full path must decide ("" when nothing was wrong but this path could not tell), or
    (False, ..., findings) when a call changed an input and the case could not be rebuilt for the
    full path: then the INPUT_MUTATION findings are this path's own.

    Every check writes into one device int64 vector, the board, read by one sync: a slot per
    input (starting from its negated fingerprint, the fingerprint after the calls added: 0 while
    unchanged), the fused check's two slots, and a slot per guarded output of each call (its
    zones' fingerprint, against their fill's). Host time is what this path spends most on, so:
    no sync between the calls and the checks, one launch for all the fingerprints, and a fresh
    case's board comes from its snapshot's launch (``Snapshot.board``)."""
    dev = case.device
    snap = _snapshot(opdef, case)
    with _stage("run", dev):
        # Timed (bench --harness), each stage ends in a sync: wait inside the call instead, so an
        # asynchronous error is still the call's own.
        wait = _STAGES is not None
        first = call_impl(opdef=opdef, fn=fn, case=case, fill=PATTERNS[0], prefill=True, share=True, wait=wait)
    second = None
    if rerun and first.error is None and not first.redzone:
        with _stage("rerun", dev):
            second = call_impl(opdef=opdef, fn=fn, case=case, fill=PATTERNS[1], prefill=True, share=True,
                               wait=wait)
    # What keeps the fused check from judging a call: its error, its red-zone hits (the full path
    # reports both), a guarded output that could not be prefilled ("": nothing wrong, just no say).
    troubles = [t for t in (_trouble(opdef, c, label) for c, label in ((first, ""), (second, "ran, and a second run ")))
                if t is not None]
    guards = [(f"wrote into {name}'s guard zones", g) for c in (first, second) if c is not None
              for name, g in c.guards.items()]
    # The board: the inputs' slots, the fused check's two, then one per guarded output of each call.
    at = len(snap.names)
    zones_at = at + 2
    board = snap.board(2 + len(guards))
    with _stage("inputs", dev):  # after the calls: the inputs are the case's own tensors, shared
        # Launched before the fused check: the GPU runs it while the host prepares that one.
        add_words(board, snap.items()  # one launch for all
                  + [(word_view(z), zones_at + j) for j, (_, g) in enumerate(guards) for z in g.zones()])
    with _stage("oracle", dev):
        both = second.outputs if second is not None and opdef.guarded else None
        judged = not troubles and _quietly(lambda: opdef.fast_check(case, first.outputs, both, board[at:zones_at]),
                                           case.op, False)
    extra = ([(f"gave {name} a second run did not", differ_flag(a, b)) for name, a, b in _rerun_pairs(first, second)]
             if second is not None and second.error is None else [])  # outputs the impl allocated
    try:  # the one sync
        values = (torch.cat([board, *(f.reshape(1).to(torch.int64) for _, f in extra)]) if extra else board).tolist()
    except RuntimeError:  # an asynchronous error of a call (no sync after it): the full path syncs each
        return False, "", None
    changed = [name for name, v in zip(snap.names, values) if v]
    # A guarded output's zones against their fill's fingerprint (a host int, cached per layout:
    # asked for after the sync, so a new layout's own sync cannot meet a call's pending error).
    flagged = ([f"changed its input {name}" for name in changed]
               + [what for j, (what, g) in enumerate(guards) if values[zones_at + j] != untouched_zones(g)]
               + [what for (what, _), v in zip(extra, values[zones_at + len(guards):]) if v])
    verdict = max(values[at:at + 2]) if judged else 2  # 2: a case it does not handle, a sign of nothing
    if verdict == 1:
        flagged.insert(0, "gave outputs the fused check found different from the oracle's")
    seen = [t for t in troubles if t] + flagged
    if not seen and verdict == 0:
        return True, "", None
    if changed and not _restore(case, snap):
        return False, "", [Finding(kind=Kind.INPUT_MUTATION, op=case.op, impl=entry.name, case_id=case.case_id,
                                   tensor=name, cause=f"{name}:mutated",
                                   message=f"input {name} changed during the call (its fingerprint moved; the "
                                           "case could not be rebuilt from its spec and seed to say where)")
                           for name in changed]
    return False, "; ".join(seen), None


def _trouble(opdef: OpDef, call: Call | None, label: str) -> str | None:
    """Why the fused check cannot judge this call: what it did wrong, "" when it did nothing wrong
    but its guarded outputs could not be prefilled; None: it can (or there was no such call)."""
    if call is None:
        return None
    if call.error is not None:
        return f"{label}raised {first_line(call.error)}"
    if call.redzone:
        return f"{label}wrote into a red zone"
    if opdef.guarded and not call.prefilled:
        return ""
    return None


def _full_path(*, opdef: OpDef, case: Case, entry: ImplEntry, fn: Callable, policy: Policy, rerun: bool,
               oracle: Callable[[Case], Mapping[str, Any]] | None, ctx: Context) -> list[Finding]:
    """The first run against the oracle, its red zones, guard zones and inputs; then, for
    guarded outputs (or a sampled re-run), a second run over the other fill: its guard zones,
    the write map of the two runs, and the re-run's agreement with the first."""
    dev = case.device
    with _stage("run", dev):
        first = call_impl(opdef=opdef, fn=fn, case=case, fill=PATTERNS[0])
    findings: list[Finding] = redzone_findings(first, ctx)
    if first.error is not None:
        findings.append(Finding(kind=Kind.EXCEPTION, op=case.op, impl=entry.name, case_id=case.case_id,
                                cause=type(first.error).__name__,
                                message=f"raised on a valid input: {first_line(first.error)}"))
        return _review(opdef, case, first, findings, ctx) + input_mutations(case, first.inputs, ctx)
    with _stage("inputs", dev):
        mutated = input_mutations(case, first.inputs, ctx)
    second = None
    if first.guards or rerun:
        # Unchanged inputs are passed again rather than copied again: at realistic sizes a copy
        # of the cache costs about as much as the kernel under test.
        with _stage("rerun", dev):
            second = call_impl(opdef=opdef, fn=fn, case=case, fill=PATTERNS[1],
                               reuse=None if mutated else first.inputs)
    with _stage("oracle", dev):
        expected = (oracle or opdef.oracle)(case)
        findings += compare(expected=expected, actual=first.outputs, policy=policy, ctx=ctx)
    findings = _review(opdef, case, first, findings, ctx)
    with _stage("guards", dev):
        for name, g in first.guards.items():
            findings += oob_findings(name=name, g=g, op=case.op, impl=entry.name, case_id=case.case_id)
    findings += mutated
    if second is not None:
        if second.error is not None:
            findings.append(Finding(kind=Kind.NONDETERMINISM, op=case.op, impl=entry.name, case_id=case.case_id,
                                    cause="rerun_raised",
                                    message=f"a second run of the same case raised: {first_line(second.error)}"))
        else:
            with _stage("guards", dev):
                for name, g in second.guards.items():
                    findings += [f for f in oob_findings(name=name, g=g, op=case.op, impl=entry.name,
                                                         case_id=case.case_id)
                                 if not any(f.dedup_key == h.dedup_key for h in findings)]
                    findings += write_map_findings(name=name, run_a=first.guards[name], run_b=g, op=case.op,
                                                   impl=entry.name, case_id=case.case_id)
                findings += _rerun_differs(first, second, ctx)
    return findings


def run_case(*, case: Case, entry: ImplEntry, policy: Policy = Policy(), fn: Callable | None = None,
             rerun: bool = False, slow_oracle: bool = False, fast: bool | None = None) -> CaseResult:
    """Findings of one implementation on one case (empty tuple: it agreed with the oracle)."""
    start = time.perf_counter()
    opdef = OP_DEFS[case.op]
    missing = opdef.needs(case) - entry.capabilities
    if missing:
        return CaseResult(case_id=case.case_id, skipped=f"impl lacks capability: {', '.join(sorted(missing))}")
    fn = fn if fn is not None else entry.load(case.device)
    findings = check_call(case=case, entry=entry, fn=fn, policy=policy, rerun=rerun,
                          oracle=opdef.oracle_slow if slow_oracle else None, fast=fast)
    if findings:  # the spec as a dict only when a finding carries it (thousands of calls at realistic sizes)
        spec = spec_to_dict(case.spec)
        findings = [dataclasses.replace(f, seed=case.seed, spec=spec) for f in findings]
    return CaseResult(case_id=case.case_id, findings=tuple(findings), seconds=time.perf_counter() - start)
