"""Adding an op touches the op table and one file per folder, and everything else follows.

A toy op (``y = 2 * x``) is written here the way a real one is: its inputs (as
generators/ops/<op>.py would hold them), its oracle (oracles/), its
implementations and a planted bug (kernels/), and its row (harness/ops/<op>.py),
then one line: ``OPS.with_op(TOY)``. The fuzz loop, shrinking and bundles,
the mutation score, the verdict and the CLI's choices then take it with no
other change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.draw import Drawer, Knobs
from mlafuzz.generators.generator import Generator
from mlafuzz.generators.reduce import halvings
from mlafuzz.generators.rng.pool import Draws
from mlafuzz.generators.spec import check_int
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.cli.main import build_parser
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.op import Op
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.registry import Registry, default_registry
from mlafuzz.tests.support.helpers import cpu_mutants


# --- generators/ops/toy.py ------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ToySpec:
    op: ClassVar[str] = "toy"
    n: int

    def __post_init__(self) -> None:
        check_int("ToySpec", "n", self.n, lo=1, hi=1 << 16)


def draw(d: Drawer, knobs: Knobs) -> ToySpec:
    return ToySpec(n=d.integer(1, 64))


def materialize(spec: ToySpec, *, seed: int, device: str) -> Case:
    x = Draws(seed, "toy").words(spec.n, device=device) % 100  # on the device, the same bytes everywhere
    return Case(op="toy", spec=spec, seed=seed, device=device, tensors={"x": x}, params={})


def reduce(spec: ToySpec) -> Iterator[ToySpec]:
    for v in halvings(spec.n, floor=1):
        yield dataclasses.replace(spec, n=v)


# --- oracles/toy.py ---------------------------------------------------------------
def oracle(case: Case) -> dict[str, torch.Tensor]:
    return {"y": case.tensors["x"] * 2}


# --- kernels/toy.py ---------------------------------------------------------------
def toy(x: torch.Tensor) -> torch.Tensor:
    return x + x


def toy_last_wrong(x: torch.Tensor) -> torch.Tensor:  # the planted bug: the last element is off by one
    y = x + x
    y[-1] += 1
    return y


ENTRIES = (
    ImplEntry(op="toy", name="ours", loader=lambda device: toy, devices=frozenset({"cpu"}), rejects=frozenset()),
    ImplEntry(
        op="toy",
        name="toy_last_wrong",
        loader=lambda device: toy_last_wrong,
        devices=frozenset({"cpu"}),
        rejects=frozenset(),
        is_mutant=True,
        expected_kind="VALUE_MISMATCH",
        description="the last element is off by one",
    ),
)


GENERATOR = Generator(
    spec_type=ToySpec,
    draw=draw,
    materialize=materialize,
    features=lambda s: {f"n:{s.n % 2}"},
    size=lambda s: {"n": s.n},
    reduce=reduce,
)


# --- harness/ops/toy.py -----------------------------------------------------------
TOY = Op(
    name="toy",
    generator=GENERATOR,
    oracle=oracle,
    oracle_slow=oracle,
    invoke=lambda fn, case, t, sub: {"y": fn(t["x"])},
    defaults={"cpu": ("ours",)},
    contract=frozenset(),
)

# --- harness/ops/table.py: the one line -------------------------------------------
TABLE = OPS.with_op(TOY)


def _session() -> Session:
    return Session(table=TABLE, registry=Registry.of((*default_registry().entries(), *ENTRIES)))


def test_a_toy_op_is_fuzzed_shrunk_and_bundled_through_the_table_alone(tmp_path):
    session = _session()
    clean = fuzz(
        FuzzConfig(ops=("toy",), impls={"toy": "ours"}, device="cpu", cases=20, out_dir=tmp_path / "ok", table=TABLE),
        executor=InProcess(session=session),
    )
    assert clean.cases == 20 and clean.findings == 0 and clean.coverage
    bad = fuzz(
        FuzzConfig(
            ops=("toy",),
            impls={"toy": "toy_last_wrong"},
            device="cpu",
            cases=6,
            out_dir=tmp_path / "bad",
            shrink_budget=5,
            table=TABLE,
        ),
        executor=InProcess(session=session),
    )
    assert bad.findings == 6 and set(bad.by_kind) == {"VALUE_MISMATCH"}
    (bundle,) = bad.bundles
    assert bundle["size"] == {"n": 1}  # shrunk by the toy's own reducer to a one-element case


def test_the_mutation_score_and_the_cli_take_the_toy_op_from_the_table(tmp_path):
    results, clean = cpu_mutants("toy", cases=10, out=tmp_path, in_session=_session())
    assert [(r.name, r.killed) for r in results] == [("toy_last_wrong", True)] and clean == []
    args = build_parser(names=TABLE.names).parse_args(["fuzz", "--op", "toy", "--cases", "1"])
    assert args.op == ["toy"]
