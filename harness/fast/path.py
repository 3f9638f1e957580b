"""The GPU fast path: one run into prefilled outputs, every check read as device flags in one sync.

The implementation gets views of the case's own inputs, fingerprinted before
and after the calls instead of copied and compared (fingerprint.py). A guarded
output (gather's ``dst``) is prefilled so that no byte already holds its
expected value, so an output the fused check then passes was written at every
byte: one run settles the write map. A fused exact kernel per op
(convert.py, gather.py, writer.py) says "outputs are the oracle's" or "look
closer". All of a case's checks (fused check, fingerprints, guard zones, a
sampled re-run) write into one device int64 vector, the board, read by one
host sync.

The result is named (``Clear``, ``Undecided``, ``Found``): all clear means
exactly what the full path would conclude with no finding; anything raised
sends the case to the full path (harness/check/full.py) for the exact finding,
its inputs rebuilt from spec and seed if a call changed them. Deleting this
room loses only speed: the runner then sends every case down the full path.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.check.calls import Call, call_shared, first_line
from mlafuzz.harness.check.compare import Context
from mlafuzz.harness.check.detectors import rerun_pairs
from mlafuzz.harness.check.stages import stage
from mlafuzz.harness.fast.fingerprint import Snapshot, add_words
from mlafuzz.harness.fast.state import CaseState, Resources
from mlafuzz.harness.memory.bits import differ_flag, word_view
from mlafuzz.harness.memory.guards import PATTERNS, Guarded
from mlafuzz.harness.memory.redzone import RedZone
from mlafuzz.harness.ops.op import Op, Outputs
from mlafuzz.reports.findings import Finding, Kind

# The detector pipeline's steps (harness/check/pipeline.py) that this path reproduces for every op
# it judges: the call's exception, pending CUDA error and red zones (``_trouble``), its outputs
# against the oracle's, zero blocks included (the op's fused check), its guard zones and write map
# (the prefill, the zones' counts), its inputs (fingerprints), and a re-run's own.
COVERED = frozenset(
    {
        "redzone",
        "launch_error",
        "exception",
        "compare",
        "zero_blocks",
        "guard_zones",
        "input_mutation",
        "rerun_launch_error",
        "rerun_raised",
        "write_map",
        "rerun_outputs",
    }
)


# Board slots made with the snapshot for the calls' guarded outputs (convert: out and valid_counts
# of two calls); a case with more gets a copy of the board (one more device op).
_ROOM = 4


@dataclass(frozen=True)
class FastOp:
    """An op's fused check, the prefill of its guarded outputs (None: it has none), and the
    pipeline steps the path covers for it (a check module's ``COVERS``, default ``COVERED``)."""

    check: Callable[[Case, Outputs, Outputs | None, torch.Tensor, CaseState], bool]
    prefill: Callable[[Case, Mapping[str, Guarded], CaseState], bool] | None = None
    covers: frozenset[str] = COVERED
    # The cases this path judges (None: all): the others go to the full path before any call.
    takes: Callable[[Case], bool] | None = None
    # Whether ``check`` judges a re-run's outputs itself (given as ``second`` for every case):
    # then no bit-for-bit comparison of the outputs the implementation allocated is made beside it.
    reruns: bool = False
    # How this path calls the implementation instead of the op row's ``invoke`` (None: as the row
    # does): the row's signature plus the case's state, keyword ``state``.
    invoke: Callable[..., Outputs] | None = None


@functools.cache
def _fast_module(name: str) -> FastOp | None:
    """The op row's ``fast`` names a module of this room: its ``check``, ``prefill`` and ``COVERS``
    (None where it cannot be imported: that op's cases then take the full path, as without the room)."""
    try:
        mod = importlib.import_module(f"{__package__}.{name}")
    except ImportError:
        return None
    return FastOp(
        check=mod.check,
        prefill=getattr(mod, "prefill", None),
        covers=getattr(mod, "COVERS", COVERED),
        takes=getattr(mod, "takes", None),
        reruns=getattr(mod, "RERUNS", False),
        invoke=getattr(mod, "invoke", None),
    )


def fast_op(op: Op) -> FastOp | None:
    """The fused check of ``op``, as its row declares it (``Op.fast``); None: it has none."""
    return _fast_module(op.fast) if op.fast is not None else None


@dataclass(frozen=True)
class Clear:
    """Every check of the case passed."""


@dataclass(frozen=True)
class Undecided:
    """The full path must decide; ``seen`` is what this path saw go wrong ("" when nothing did, but
    it could not tell). ``ran``: the implementation was called here (False: the case was declined
    before any call, which costs nothing)."""

    seen: str
    ran: bool = True


@dataclass(frozen=True)
class Found:
    """Decided here: a call changed an input and the case could not be rebuilt for the full path."""

    findings: tuple[Finding, ...]


FastResult = Clear | Undecided | Found


def handles(op: Op) -> bool:
    """Whether this path judges ``op``'s cases."""
    return fast_op(op) is not None


def uncovered(op: Op, detectors: Iterable[Any]) -> tuple[str, ...]:
    """The names of ``detectors`` (pipeline steps) this path does not reproduce for ``op``: after a
    ``Clear`` its case must still go down the full path, which runs them (drive/run.py)."""
    fast = fast_op(op)
    covers = fast.covers if fast is not None else frozenset()
    return tuple(d.name for d in detectors if d.name not in covers)


def _quietly(res: Resources, op: str, fn: Callable[[], object], default: object) -> object:
    """One step of this path; a failure of the step itself (not of the implementation under test)
    must never become a finding or a crash: it means "take the full path"."""
    try:
        return fn()
    except Exception as exc:
        if op not in res.failed:
            res.failed.add(op)
            import warnings

            warnings.warn(
                f"fast check for {op} failed ({first_line(exc)}); using the full oracle", RuntimeWarning, stacklevel=3
            )
        return default


def _call(
    *,
    op: Op,
    fast: FastOp,
    fn: Callable,
    state: CaseState,
    fill: int,
    sub: Callable[[str], Callable],
    wait: bool,
    redzone: RedZone | None,
) -> tuple[Call, bool]:
    """(the call, whether its guarded outputs were prefilled by the op's prefill)."""
    case = state.case
    guards: dict[str, Guarded] = op.guarded(case, fill) if op.guarded else {}
    prefilled = True
    if guards:  # an op may guard outputs in some cases only (convert's caller-owned ones)
        prefilled = bool(
            fast.prefill is not None and _quietly(state.res, op.name, lambda: fast.prefill(case, guards, state), False)
        )
        if not prefilled:  # filled as made, but a prefill that failed part way may have written some
            for g in guards.values():
                g.region().fill_(g.fill)
    invoke = functools.partial(fast.invoke, state=state) if fast.invoke is not None else None
    call = call_shared(op=op, fn=fn, case=case, guards=guards, sub=sub, wait=wait, redzone=redzone, invoke=invoke)
    return call, prefilled


def _trouble(call: Call | None, prefilled: bool, label: str) -> str | None:
    """Why the fused check cannot judge this call: what it did wrong, "" when it did nothing wrong
    but its guarded outputs could not be prefilled; None: it can (or there was no such call)."""
    if call is None:
        return None
    if call.error is not None:
        return f"{label}raised {first_line(call.error)}"
    if call.launch_error is not None:
        return f"{label}left a CUDA error pending ({call.launch_error})"
    if call.redzone:
        return f"{label}wrote into a red zone"
    return None if prefilled else ""


def _restore(op: Op, case: Case, snap: Snapshot, held: Mapping[str, torch.Tensor]) -> bool:
    """Rebuild the case's input tensors in place from its spec and seed (a call changed them) and
    say whether they hold what they held before, fingerprints and copies agreeing."""
    try:
        fresh = op.materialize(case.spec, seed=case.seed, device=case.device)
    except Exception:  # a hand-built case: nothing to rebuild it from
        return False
    for name in [*snap.names, *held]:
        t, f = case.tensors[name], fresh.tensors.get(name)
        if f is None or f.shape != t.shape or f.dtype != t.dtype:
            return False
        t.copy_(f)
    return not snap.changed() and not _moved(case, held)


def _moved(case: Case, held: Mapping[str, torch.Tensor]) -> list[str]:
    """The inputs held as copies (``fast_path``) that no longer equal their copy."""
    return [k for k, v in held.items() if not _same_bytes(case.tensors[k], v)]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two host tensors of one shape and dtype hold the same bytes (compared as 8-byte
    words where they can be: a few MB of uint8 host cache compare six times faster so)."""
    if a.is_contiguous() and b.is_contiguous() and a.nbytes % 8 == 0 and a.shape == b.shape and a.dtype == b.dtype:
        return torch.equal(
            a.reshape(-1).view(torch.uint8).view(torch.int64), b.reshape(-1).view(torch.uint8).view(torch.int64)
        )
    return torch.equal(a, b)


@dataclass(frozen=True, kw_only=True)
class _Calls:
    """The path's calls of one case: the first, and the sampled re-run (None: none was made), each
    with whether its guarded outputs were prefilled."""

    first: Call
    second: Call | None
    troubles: list[str]  # what the calls did that the fused check cannot judge ("": no prefill)


def _run(
    *,
    op: Op,
    fast: FastOp,
    fn: Callable,
    state: CaseState,
    rerun: bool,
    sub: Callable,
    wait: bool,
    redzone: RedZone | None,
) -> _Calls:
    with stage("run"):
        first, pre1 = _call(op=op, fast=fast, fn=fn, state=state, fill=PATTERNS[0], sub=sub, wait=wait, redzone=redzone)
    second, pre2 = None, True
    if rerun and first.error is None and not first.redzone and first.launch_error is None:
        with stage("rerun"):
            second, pre2 = _call(
                op=op, fast=fast, fn=fn, state=state, fill=PATTERNS[1], sub=sub, wait=wait, redzone=redzone
            )
    troubles = [
        t for t in (_trouble(first, pre1, ""), _trouble(second, pre2, "ran, and a second run ")) if t is not None
    ]
    return _Calls(first=first, second=second, troubles=troubles)


@dataclass(frozen=True, kw_only=True)
class _Board:
    """The board's layout (see ``fast_path``), and the re-run flags read with it."""

    board: torch.Tensor
    at: int  # the fused check's two slots
    guards: list[tuple[str, Guarded]]  # (what a changed zone says, the guarded output), from zones_at on
    extra: list[tuple[str, torch.Tensor]]  # (what a raised flag says, the flag), read after the board
    judged: bool  # whether the fused check ran on the outputs

    @property
    def zones_at(self) -> int:
        return self.at + 2


def _fill_board(*, op: Op, fast: FastOp, calls: _Calls, snap: Snapshot, state: CaseState) -> _Board:
    """Launch every check of the calls into one board, with no sync."""
    res, case, first, second = state.res, state.case, calls.first, calls.second
    guards = [
        (f"wrote into {name}'s guard zones", g)
        for c in (first, second)
        if c is not None
        for name, g in c.guards.items()
    ]
    at = len(snap.names)
    board = snap.board(len(guards))  # the check's two slots are the snapshot's
    with stage("inputs"):  # after the calls: the inputs are the case's own tensors, shared
        # Launched before the fused check: the GPU runs it while the host prepares that one.
        add_words(
            board,
            snap.items() + [(word_view(z), at + 2 + j, g.fill) for j, (_, g) in enumerate(guards) for z in g.zones()],
            launchers=res.launchers,
        )
    with stage("oracle"):
        both = second.outputs if second is not None and (second.guards or fast.reruns) else None
        judged = not calls.troubles and bool(
            _quietly(res, op.name, lambda: fast.check(case, first.outputs, both, board[at : at + 2], state), False)
        )
    extra = (
        [(f"gave {name} a second run did not", differ_flag(a, b)) for name, a, b in rerun_pairs(first, second)]
        if second is not None and second.error is None and not (judged and fast.reruns)
        else []
    )  # outputs the impl allocated, unless the check judged the re-run's
    return _Board(board=board, at=at, guards=guards, extra=extra, judged=judged)


def _flagged(b: _Board, values: list[int], snap: Snapshot) -> tuple[list[str], list[str]]:
    """(the inputs whose fingerprint moved, everything the board says went wrong, in words)."""
    changed = [name for name, v in zip(snap.names, values) if v]
    # A guarded output's zones: the count of their words that no longer hold the fill.
    flagged = (
        [f"changed its input {name}" for name in changed]
        + [what for j, (what, _) in enumerate(b.guards) if values[b.zones_at + j]]
        + [what for (what, _), v in zip(b.extra, values[b.zones_at + len(b.guards) :]) if v]
    )
    verdict = max(values[b.at : b.at + 2]) if b.judged else 2  # 2: a case it does not handle, a sign of nothing
    if verdict == 1:
        flagged.insert(0, "gave outputs the fused check found different from the oracle's")
    if verdict != 0 and not flagged:
        flagged.append("")  # nothing seen to go wrong, but not judged either
    return changed, flagged


def fast_path(
    *,
    op: Op,
    case: Case,
    fn: Callable,
    ctx: Context,
    rerun: bool,
    sub: Callable[[str], Callable],
    res: Resources,
    redzone: RedZone | None = None,
    wait: bool = False,
) -> FastResult:
    """Check ``case`` on ``fn`` (see the module docstring). ``wait``: a device sync inside each call
    (a profiled check: an asynchronous error is then still the call's own).

    The board: a slot per input (starting from its negated fingerprint, the fingerprint after the
    calls added: 0 while unchanged), the fused check's two, then one per guarded output of each
    call (the count of its zones' words that no longer hold the fill). Host time is what this path spends most
    on, so: no sync between the calls and the checks, and one launch for all the fingerprints."""
    fast = fast_op(op)
    assert fast is not None, f"op {op.name!r} has no fast check (handles() says so first)"
    if fast.takes is not None and not fast.takes(case):
        return Undecided(seen="", ran=False)  # nothing called yet: the full path judges it alone
    inputs = {k: v for k, v in case.tensors.items() if v is not None and k not in op.inplace}
    # An input off the case's device (a GPU gather's pinned host cache, SPEC 9.3) is held as a copy
    # and compared on the host: the fingerprint kernels read the device's memory.
    held = {k: res.hold(k, v) for k, v in inputs.items() if v.device.type != torch.device(case.device).type}
    snap = Snapshot(
        {k: v for k, v in inputs.items() if k not in held},
        device=case.device,
        launchers=res.launchers,
        slots=2,  # the fused check's
        room=_ROOM,
    )
    state = CaseState(case=case, res=res, slots=snap.slots)
    calls = _run(op=op, fast=fast, fn=fn, state=state, rerun=rerun, sub=sub, wait=wait, redzone=redzone)
    b = _fill_board(op=op, fast=fast, calls=calls, snap=snap, state=state)
    try:  # the one sync
        flags = [f.reshape(1).to(torch.int64) for _, f in b.extra]
        values = (torch.cat([b.board, *flags]) if flags else b.board).tolist()
    except RuntimeError:  # an asynchronous error of a call (no sync after it): the full path syncs each
        return Undecided(seen="")
    changed, flagged = _flagged(b, values, snap)
    moved = _moved(case, held)
    changed, flagged = changed + moved, flagged + [f"changed its input {k}" for k in moved]
    seen = [t for t in calls.troubles + flagged if t]
    if not calls.troubles and not flagged:
        return Clear()
    if changed and not _restore(op, case, snap, held):
        return Found(
            tuple(
                ctx.finding(
                    name,
                    "mutated",
                    kind=Kind.INPUT_MUTATION,
                    message=f"input {name} changed during the call (its fingerprint moved; the "
                    "case could not be rebuilt from its spec and seed to say where)",
                )
                for name in changed
            )
        )
    return Undecided(seen="; ".join(seen))
