"""Adding a contract revision touches the revision table and the one rule it changes.

A toy revision, ``2026-toy``, changes one rule: the writer's tile scale becomes
``max(amax / 448, FLT_MIN)`` rounded up to a power of two (a new value of
``writer_scale``, ``flt_min_pow2``). It is written the way a real one is: a row
of ``mlafuzz.oracles.revisions`` (here ``TABLE.with_revision``) and the rule's
implementations, the oracle's (``oracles/writer_scale.py`` ``SCALE_RULES``) and
ours (``kernels/revisions.py`` ``SCALE_RULES``). The CLI's choices, the oracle,
our torch writer and the fuzz loop then take it with no other change, and the
rules it does not change (``context_chunks``) are the newest's.
"""

from __future__ import annotations

import functools
import json

import torch

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.cli.main import build_parser
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels import revisions as ours
from mlafuzz.kernels import torch_impl
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.registry import Registry, default_registry
from mlafuzz.oracles import revisions, writer_scale
from mlafuzz.oracles.codec import tile_scales
from mlafuzz.oracles.fpbits import FLT_MIN

TOY = "2026-toy"


def _add_toy_revision(monkeypatch) -> None:
    # oracles/revisions.py: the row.
    table = revisions.TABLE.with_revision(
        name=TOY,
        change="a toy: the FLT_MIN floor, rounded up to a power of two",
        source="tests/harness/cli/test_toy_revision.py",
        rules={"writer_scale": "flt_min_pow2"},
        values={"writer_scale": "flt_min_pow2"},
    )
    monkeypatch.setattr(revisions, "TABLE", table)
    # The rule, where it is written: the oracle's and ours.
    monkeypatch.setitem(writer_scale.SCALE_RULES, "flt_min_pow2", writer_scale.ScaleRule(floor=FLT_MIN, pow2=True))
    monkeypatch.setitem(ours.SCALE_RULES, "flt_min_pow2", ours.ScaleRule(floor_bits=0x00800000, pow2=True, cuda=2))


def _registry() -> Registry:
    toy_torch = ImplEntry(
        op="writer",
        name="torch_toy",
        loader=lambda device: torch_impl.writer_torch,
        devices=frozenset({"cpu"}),
        rejects=frozenset(),
        revisions=frozenset({TOY}),
    )
    # A writer of 2026-07's rule, run under the toy revision: its scales are not powers of two.
    old = ImplEntry(
        op="writer",
        name="torch_2026_07",
        loader=lambda device: functools.partial(torch_impl.writer_torch, revision="2026-07"),
        devices=frozenset({"cpu"}),
        rejects=frozenset(),
    )
    return Registry.of((*default_registry().entries(), toy_torch, old))


def test_a_toy_revision_changes_its_one_rule_and_inherits_the_others(monkeypatch):
    _add_toy_revision(monkeypatch)
    row = revisions.get(TOY)
    assert revisions.names()[-1] == TOY and revisions.newest() == TOY
    assert row.changes == ("writer_scale",)
    assert row.rule("context_chunks") == revisions.get("2026-10").rule("context_chunks")
    kv = torch.full((1, 512), 3.0, dtype=torch.bfloat16)  # amax / 448 = 3/448, not a power of two
    assert tile_scales(kv_c=kv, revision=TOY).scale.tolist() == [[2.0**-7] * 4]
    assert torch_impl.tile_scales_torch(kv, revision=TOY).tolist() == [[2.0**-7] * 4]
    zeros = torch.zeros((1, 512), dtype=torch.bfloat16)
    assert tile_scales(kv_c=zeros, revision=TOY).scale.tolist() == [[FLT_MIN] * 4]  # the floor is FLT_MIN's
    args = build_parser(names=OPS.names).parse_args(["fuzz", "--op", "writer", "--revision", TOY])
    assert args.revision == TOY


def test_the_fuzz_loop_judges_a_writer_under_the_toy_revision(monkeypatch, tmp_path):
    _add_toy_revision(monkeypatch)
    session = Session(table=OPS, registry=_registry())

    def run(impl: str, name: str):
        config = FuzzConfig(
            ops=("writer",),
            impls={"writer": impl},
            device="cpu",
            cases=12,
            seed=5,
            out_dir=tmp_path / name,
            revision=TOY,
        )
        return config, fuzz(config, executor=InProcess(session=session))

    _, clean = run("torch_toy", "ok")
    assert clean.cases == 12 and clean.findings == 0 and clean.skipped == 0
    config, bad = run("torch_2026_07", "bad")
    assert bad.findings and set(bad.by_kind) == {"VALUE_MISMATCH"}
    lines = (config.out_dir / "findings.jsonl").read_text().splitlines()
    assert {json.loads(line)["revision"] for line in lines} == {TOY}
