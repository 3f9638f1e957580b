"""A writer that follows another contract revision exactly is told which one (issue 30, item 6)."""

from __future__ import annotations

import functools
import json

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels import torch_impl
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.registry import Registry, default_registry


def _writer_of(revision: str) -> ImplEntry:
    return ImplEntry(
        op="writer",
        name=f"torch_{revision}",
        loader=lambda device: functools.partial(torch_impl.writer_torch, revision=revision),
        devices=frozenset({"cpu"}),
        rejects=frozenset(),
    )


def _findings(tmp_path, impl: str, revision: str) -> list[dict]:
    registry = Registry.of((*default_registry().entries(), _writer_of("2026-07"), _writer_of("2026-09")))
    session = Session(table=OPS, registry=registry)
    config = FuzzConfig(
        ops=("writer",),
        impls={"writer": impl},
        device="cpu",
        cases=12,
        seed=1,
        out_dir=tmp_path / impl,
        revision=revision,
    )
    fuzz(config, executor=InProcess(session=session))
    path = config.out_dir / "findings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_an_older_writer_judged_under_the_newest_revision_is_told_to_pass_its_revision(tmp_path):
    # 2026-10 with the FLT_MIN writer is vllm-0.28 (vLLM 0.28-0.29): the revision that changes that one rule.
    found = _findings(tmp_path, "torch_2026-07", "2026-10")
    assert found and all(
        "matches revision vllm-0.28 exactly (writer_scale flt_min): --revision vllm-0.28" in f["message"] for f in found
    )
    assert {f["extra"]["matches_revision"] for f in found} == {"vllm-0.28"}


def test_a_newer_writer_judged_under_an_older_revision_is_told_the_revision_that_changes_only_that_rule(tmp_path):
    found = _findings(tmp_path, "torch_2026-09", "2026-07")
    assert found and all("--revision 2026-09" in f["message"] for f in found)


def test_a_wrong_writer_gets_no_hint(tmp_path):
    found = _findings(tmp_path, "writer_round_down", "2026-10")
    assert found and not any("matches revision" in f["message"] for f in found)


def _convert_of(revision: str | None) -> ImplEntry:
    """Our torch convert frozen to one revision's convert_counted rule (None: in place, as vLLM <= 0.29)."""
    return ImplEntry(
        op="convert",
        name=f"torch_{revision}",
        loader=lambda device: functools.partial(torch_impl.convert_torch, revision=revision),
        devices=frozenset({"cpu"}),
        rejects=frozenset(),
        capabilities=frozenset(),
    )


def _convert_findings(tmp_path, revision_of_impl: str | None, judged_under: str) -> list[dict]:
    registry = Registry.of((*default_registry().entries(), _convert_of(revision_of_impl)))
    config = FuzzConfig(
        ops=("convert",),
        impls={"convert": f"torch_{revision_of_impl}"},
        device="cpu",
        cases=16,
        seed=3,
        out_dir=tmp_path / f"convert_{revision_of_impl}",
        revision=judged_under,
    )
    fuzz(config, executor=InProcess(session=Session(table=OPS, registry=registry)))
    path = config.out_dir / "findings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_an_in_place_convert_judged_under_compact_is_told_the_revision_it_matches(tmp_path):
    found = _convert_findings(tmp_path, None, "2026-11")
    assert found and all(
        "matches revision 2026-10 exactly (convert_counted in_place): --revision 2026-10" in f["message"] for f in found
    )


def test_a_compacting_convert_judged_under_in_place_is_told_the_revision_it_matches(tmp_path):
    found = _convert_findings(tmp_path, "2026-11", "2026-10")
    assert found and all("matches revision 2026-11 exactly (convert_counted compact)" in f["message"] for f in found)
