"""Contract revisions through the harness (SPEC section 7): selection, pins, findings, bundles, replay."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from mlafuzz.generators.draw import SMALL
from mlafuzz.generators.ops.writer import WriterSpec
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.replay import replay
from mlafuzz.harness.drive.tasks import Task, execute
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.harness.ops.writer import LOG2F_BAND_CAUSE, band_tokens, relabel_band
from mlafuzz.oracles.writer_scale import NEWEST, REVISIONS
from mlafuzz.reports.findings import Finding, Kind
from mlafuzz.tests.support.helpers import materialize, session


def _fuzz(tmp_path: Path, impl: str, revision: str, cases: int = 16, **kw):
    config = FuzzConfig(
        ops=("writer",),
        impls={"writer": impl},
        device="cpu",
        cases=cases,
        seed=3,
        out_dir=tmp_path / f"{impl}-{revision}",
        revision=revision,
        **kw,
    )
    return config, fuzz(config, executor=InProcess(session=Session(table=OPS)))


def _lines(out: Path) -> list[dict]:
    path = out / "findings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.parametrize("revision", REVISIONS)
def test_our_torch_writer_draws_nothing_under_either_revision(tmp_path, revision):
    config, summary = _fuzz(tmp_path, "torch", revision, cases=24)
    assert summary.cases == 24 and summary.findings == 0 and summary.skipped == 0
    assert json.loads((config.out_dir / "run.json").read_text())["revision"] == revision


def test_a_writer_of_one_revision_is_found_when_the_run_names_the_other(tmp_path):
    """writer_scale_pow2 is near enough the 2026-09 rule; pinned to 2026-07 it is judged there, and
    its findings say so, whatever the run names."""
    config, summary = _fuzz(tmp_path, "writer_scale_pow2", "2026-09")
    assert summary.findings
    assert {f["revision"] for f in _lines(config.out_dir)} == {"2026-07"}


def test_an_entry_that_follows_revisions_is_judged_under_the_runs(tmp_path):
    config, summary = _fuzz(tmp_path, "writer_writes_padding", "2026-07", cases=24)
    assert summary.findings
    assert {f["revision"] for f in _lines(config.out_dir)} == {"2026-07"}


def test_the_session_loads_a_following_entry_once_per_revision_bound_to_it():
    s = Session(table=OPS)
    entry = s.entry("writer", "torch")
    old, new = (s.load(entry, "cpu", revision=r) for r in (REVISIONS[0], REVISIONS[-1]))
    assert old.keywords == {"revision": REVISIONS[0]} and new.keywords == {"revision": REVISIONS[-1]}
    assert s.load(entry, "cpu", revision=REVISIONS[0]) is old
    assert s.load(entry, "cpu") is new  # no revision named: the newest
    gather = s.entry("gather", "torch")  # follows nothing: one callable, whatever is asked
    assert s.load(gather, "cpu", revision=REVISIONS[0]) is s.load(gather, "cpu", revision=REVISIONS[1])


def test_execute_hands_the_effective_revision_to_the_oracle_the_call_and_the_finding():
    seen = []

    def oracle(case):
        seen.append(case.params["revision"])
        return OPS.get("writer").oracle(case)

    from mlafuzz.tests.support.helpers import session_with

    s = session_with("writer", oracle=oracle)
    seed = next(i for i in range(100) if OPS.draw_spec("writer", seed=i, knobs=SMALL).num_tokens > 4)
    for impl, run_rev, judged in (("torch", "2026-07", "2026-07"), ("writer_round_down", "2026-07", "2026-09")):
        result = execute(Task(index=0, op="writer", seed=seed, impl_ref=impl, device="cpu", revision=run_rev), s)
        assert seen[-1] == judged
        assert all(f.revision == judged for f in result.findings)
    assert execute(
        Task(index=0, op="writer", seed=seed, impl_ref="writer_round_down", device="cpu"), s
    ).findings  # killed under its own pin


def test_the_log2f_band_names_the_cause_only_when_every_differing_record_is_in_it():
    case = materialize(WriterSpec(num_tokens=2), 1)
    f = Finding(
        kind=Kind.VALUE_MISMATCH,
        op="writer",
        impl="x",
        case_id="c",
        tensor="kv_cache",
        cause="kv_cache:value",
        message="kv_cache: Mismatched elements",
    )
    band, yes, no = torch.tensor([True, False]), torch.tensor([True, False]), torch.tensor([True, True])
    assert relabel_band([f], case=case, band=band, differs=yes)[0].cause == LOG2F_BAND_CAUSE
    assert relabel_band([f], case=case, band=band, differs=no) == [f]
    assert relabel_band([f], case=case, band=band, differs=torch.tensor([False, False])) == [f]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_no_16_bit_input_reaches_the_log2f_band(dtype):
    """oracles/writer_scale.py's claim, on every 16-bit pattern as a tile's amax: the review hook's
    band check never fires for bf16 or fp16 kv_c (so its cost is the cheap test alone)."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(getattr(torch, dtype))
    kv_c = torch.zeros((bits.numel() // 4, 512), dtype=bits.dtype)
    kv_c.view(-1, 4, 128)[:, :, 0] = bits.view(-1, 4)
    case = materialize(WriterSpec(num_tokens=1), 1)
    n = kv_c.shape[0]
    case = dataclasses.replace(
        case,
        tensors={**case.tensors, "kv_c": kv_c, "slot_mapping": torch.zeros(n, dtype=torch.int64)},
        params={"revision": NEWEST},
    )
    assert not band_tokens(case).any()


def test_a_bundle_records_the_revision_and_replay_uses_it_unless_told_otherwise(tmp_path):
    config, summary = _fuzz(tmp_path, "writer_writes_padding", "2026-07", cases=24, shrink_budget=3.0)
    bundles = sorted((config.out_dir / "bundles").iterdir())
    assert bundles
    case = json.loads((bundles[0] / "case.json").read_text())
    assert case["revision"] == "2026-07"
    again = replay(bundle_path=bundles[0], impl_ref=None, device="cpu", table=OPS)
    assert again.revision == "2026-07" and again.found and {f.revision for f, _ in again.found} == {"2026-07"}
    other = replay(bundle_path=bundles[0], impl_ref=None, device="cpu", table=OPS, revision="2026-09")
    assert other.found and {f.revision for f, _ in other.found} == {"2026-09"}
    assert replay(bundle_path=bundles[0], impl_ref="torch", device="cpu", table=OPS).passed


def test_the_cli_names_the_revision_and_refuses_an_unknown_one(tmp_path, capsys):
    rc = main(
        [
            "fuzz",
            "--op",
            "writer",
            "--device",
            "cpu",
            "--cases",
            "4",
            "--revision",
            "2026-07",
            "--in-process",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    assert "contract revision 2026-07" in capsys.readouterr().err
    assert (
        main(
            [
                "fuzz",
                "--op",
                "writer",
                "--device",
                "cpu",
                "--cases",
                "1",
                "--revision",
                "2026-08",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )


def test_reports_show_a_findings_revision_and_rerun_with_it():
    from mlafuzz.reports.formats.text import finding_facts
    from mlafuzz.reports.model import replay_command

    f = Finding(kind=Kind.VALUE_MISMATCH, op="writer", impl="torch", case_id="c", message="m", revision="2026-07")
    assert ("revision", "2026-07") in finding_facts(f)
    assert "--revision 2026-07" in replay_command(f, {"seed": 1, "device": "cpu"})
    assert Finding.from_json(f.to_json()) == f
    old = f.to_json()
    del old["revision"]  # a line written before revisions
    assert Finding.from_json(old).revision is None


def test_the_oracle_default_for_a_bare_case_is_the_newest():
    entry = session().entry("writer", "torch")
    assert entry.judged_under(NEWEST) == NEWEST and entry.follows(REVISIONS[0])
