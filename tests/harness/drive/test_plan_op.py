"""The ``plan`` op (SPEC 9.1) through the harness: our planner draws nothing, vLLM-shaped chunks in
any of their forms are read, and every planted planner bug is killed with METADATA_MISMATCH."""

from __future__ import annotations

import dataclasses

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.planner import plan_context_chunks
from mlafuzz.kernels.registry import Registry, default_registry
from mlafuzz.tests.support.helpers import cpu_mutants

PLANNER_MUTANTS = {"plan_unaligned_split", "plan_zero_context_joins", "plan_padding_ignored", "plan_no_max_chunk"}


def _as(form: str):
    def planner(*args):
        chunks = plan_context_chunks(*args)
        if form == "dict":
            return [dataclasses.asdict(c) for c in chunks]
        if form == "tuple":
            return tuple((c.request_start, c.request_end, c.starts, c.seq_lens, c.is_continuation) for c in chunks)
        if form == "broken":
            return [(c.request_start, c.request_end) for c in chunks]
        return chunks

    return planner


def _session() -> Session:
    extra = [
        ImplEntry(
            op="plan", name=form, loader=lambda device, f=form: _as(f), devices=frozenset({"cpu"}), rejects=frozenset()
        )
        for form in ("dict", "tuple", "broken")
    ]
    return Session(table=OPS, registry=Registry.of((*default_registry().entries(), *extra)))


def _fuzz(tmp_path, impl: str, cases: int):
    session = _session()
    config = FuzzConfig(ops=("plan",), impls={"plan": impl}, device="cpu", cases=cases, out_dir=tmp_path / impl)
    return fuzz(config, executor=InProcess(session=session))


def test_fuzzing_our_planner_written_from_spec_9_1_draws_nothing(tmp_path, capsys):
    assert main(["fuzz", "--op", "plan", "--cases", "300", "--device", "cpu", "--out", str(tmp_path / "cli")]) == 0
    assert "300 cases (plan 300), 0 findings" in capsys.readouterr().out
    summary = _fuzz(tmp_path, "ours", 300)
    assert summary.findings == 0
    assert {"dcp", "no-dcp", "args:direct", "args:call-site", "context-0", "max-chunk<budget", "split"} <= set(
        summary.coverage
    )


def test_chunks_as_dicts_or_tuples_are_read_and_a_chunk_without_its_fields_is_a_metadata_mismatch(tmp_path):
    for form in ("dict", "tuple"):
        assert _fuzz(tmp_path, form, 40).findings == 0
    broken = _fuzz(tmp_path, "broken", 10)
    assert broken.findings and set(broken.by_kind) == {"METADATA_MISMATCH"}


def test_every_planted_planner_bug_is_killed_with_metadata_mismatch(tmp_path):
    results, clean = cpu_mutants("plan", cases=200, out=tmp_path, in_session=Session(table=OPS))
    assert {r.name for r in results} == PLANNER_MUTANTS
    assert {r.name: r.found for r in results if not r.killed or set(r.found) != {"METADATA_MISMATCH"}} == {}
    assert clean == []
