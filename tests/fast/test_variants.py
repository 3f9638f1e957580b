"""A default run meets no fused-check kernel variant that ``mlafuzz warmup`` did not compile.

Triton compiles a kernel once per specialization key (its constexprs, each int argument's
== 1 / % 16 / int32 class, each pointer's 16-byte alignment), ~0.2 s a variant on the H200. A key
that follows the case (a row count, a table's stride, the board slot a flag lands in) compiles in
the middle of a run, warm or not. Here the fast path runs default cases with launchers that only
record the key each launch would compile (harness/fast/launch.py's own ``Launcher.key``), nothing
launched: the set is small, and the cases warmup draws meet all of it."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from triton.runtime.jit import JITFunction  # noqa: E402

from mlafuzz.generators.draw import KNOB_PRESETS  # noqa: E402
from mlafuzz.harness.check.session import Session  # noqa: E402
from mlafuzz.harness.cli.warmup_cmd import DEFAULT_CASES  # noqa: E402
from mlafuzz.harness.drive.fuzz import FuzzConfig  # noqa: E402
from mlafuzz.harness.drive.run import run_case  # noqa: E402
from mlafuzz.harness.fast.launch import Launcher, Launchers  # noqa: E402
from mlafuzz.harness.fast.state import Resources  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402

Variant = tuple[str, tuple, tuple, tuple]  # (kernel, Launcher.key, constexprs, launch options)


class _Recorder(Launcher):
    """Records the variant a launch would compile on the GPU; launches nothing."""

    def __init__(self, fn, seen: set[Variant]) -> None:
        if not hasattr(fn, "params"):  # interpreted (TRITON_INTERPRET=1): the jit function it wraps
            lists = ("do_not_specialize", "do_not_specialize_on_alignment")
            fn = JITFunction(fn.fn, **{k: v for k, v in fn.kwargs.items() if k in lists})
        super().__init__(fn)
        self._seen = seen

    def __call__(self, grid, args, constexprs, *, key=None, **options) -> None:
        key = self.key(args) if key is None else key
        self._seen.add((self._fn.fn.__name__, key, tuple(constexprs.items()), tuple(options.items())))


class _Recorders(Launchers):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[Variant] = set()

    def __call__(self, fn) -> Launcher:
        if id(fn) not in self._by_fn:
            self._by_fn[id(fn)] = _Recorder(fn, self.seen)
        return self._by_fn[id(fn)]


def _variants(op_name: str, indices: range) -> set[Variant]:
    """The variants the fast path launches for op ``op_name``'s cases among tasks ``indices`` of a
    default run (every op, seed 0, default knobs): the run ``mlafuzz warmup`` prepares."""
    session = Session(table=OPS)
    recorders = _Recorders()
    session.fast = Resources()
    session.fast.launchers = recorders
    ops = tuple(OPS.names)
    cfg = FuzzConfig(
        ops=ops,
        impls={o: session.default_ref(o, "cpu") for o in ops},
        device="cpu",
        cases=len(indices),
        seed=0,
        knobs=KNOB_PRESETS["small"],
    )
    op = OPS.get(op_name)
    for i in indices:
        task = cfg.task(i)
        if task.op != op_name:
            continue
        entry = session.entry(op_name, task.impl_ref)
        spec = task.resolve(OPS).spec
        spec = op.fit(spec, entry.capabilities) if op.fit is not None else spec
        case = op.materialize(spec, seed=task.seed, device="cpu")
        run_case(session=session, case=case, entry=entry, fast=True, rerun=task.rerun)
    return recorders.seen


def _by_kernel(variants: set[Variant]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, *_ in variants:
        counts[name] = counts.get(name, 0) + 1
    return counts


def test_a_default_runs_gather_cases_compile_nothing_warmup_did_not():
    n_ops = len(OPS.names)
    warm = DEFAULT_CASES["cuda"] * n_ops  # warmup's small pass: the run's first tasks, the same draws
    warmed = _variants("gather", range(warm))
    run = _variants("gather", range(warm, warm + 200 * n_ops))
    counts = _by_kernel(warmed | run)
    # One variant each: the check's mode (prefill, one run, two runs), seq_starts and the host tier
    # are runtime values (as constexprs: six variants of the check, four of the map, ~0.65 s each
    # in every worker of a cold run), and nothing follows the case's shapes or views.
    assert counts["_rows"] == 1 and counts["_record_map"] == 1, counts
    # Every fingerprint launch, before (sign -1) and after the call (+1), of any word widths:
    # one variant (the sign as a constexpr, and each width a pointer dtype, made more, ~1.6 s each).
    assert counts["_fingerprints"] == 1, counts
    assert run - warmed == set(), sorted(run - warmed)


@pytest.mark.parametrize("op_name", [o for o in OPS.names if o != "gather"])
def test_a_default_runs_cases_of_every_op_meet_at_most_two_variants_of_each_check_kernel(op_name):
    """Each fast-path kernel compiles in every worker of a cold run (~0.2-0.7 s a variant on an
    H100), so whatever a case draws (K, compaction, prefill rows, DCP, modes, the writers' input
    dtypes, views) is a runtime value of one variant. The convert check alone has two: its tiles."""
    counts = _by_kernel(_variants(op_name, range(60 * len(OPS.names))))
    assert all(n <= (2 if kernel == "_check_convert" else 1) for kernel, n in counts.items()), counts
