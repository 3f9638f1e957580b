"""The convert's planted bugs of vLLM's releases (SPEC 10) are killed on the CPU with their one kind,
and ours stay clean under the newest revision (counted rows compacted) and the one before (in place)."""

from __future__ import annotations

import json

import pytest

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.registry import default_registry

CASES = 40
RELEASE_MUTANTS = (
    "convert_compact_hole",  # vLLM #58058 under 0.30.0's rule
    "convert_compact_tail_unwritten",  # vLLM #51323's review, through a caller's out=
    "convert_idx_mapping_ignored",  # 0.33.0
    "convert_rank_stride_ignored",  # 0.30.0
)


def _kinds(tmp_path, impl: str, revision: str | None) -> tuple[set[str], dict]:
    config = FuzzConfig(
        ops=("convert",),
        impls={"convert": impl},
        device="cpu",
        cases=CASES,
        seed=0,
        out_dir=tmp_path / f"{impl}-{revision}",
        revision=revision,
        shrink_budget=0.0,
    )
    summary = fuzz(config, executor=InProcess(session=Session(table=OPS)))
    path = config.out_dir / "findings.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {f["kind"] for f in found}, summary.coverage


@pytest.mark.parametrize("name", RELEASE_MUTANTS)
def test_each_release_mutant_is_killed_drawing_only_its_kind(tmp_path, name):
    entry = default_registry().get("convert", name)
    kinds, _ = _kinds(tmp_path, name, None)  # the newest revision: counted rows compacted
    assert kinds == {entry.expected_kind}


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("revision", ["2026-10", "2026-11"])
def test_ours_draw_nothing_on_the_releases_arguments_under_either_counted_rule(tmp_path, impl, revision):
    kinds, coverage = _kinds(tmp_path, impl, revision)
    assert kinds == set()
    assert coverage["idx-mapping"] and coverage["dcp-args:dn"]  # the new arguments were drawn
