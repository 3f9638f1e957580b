"""The detector pipeline: a detector added to a session runs on every case, the CPU's full path and
a GPU case the fast path clears alike; the fast path may skip only the steps it declares."""

from __future__ import annotations

import pytest

from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
from mlafuzz.generators.spec import Paging
from mlafuzz.harness.check.pipeline import DETECTORS, Detector, Evidence
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.run import run_case
from mlafuzz.reports.findings import Finding, Kind, Severity
from mlafuzz.tests.support.helpers import OPS, materialize

SPEC = ConvertSpec(
    requests=(ConvertRequest(seq_len=40, num_tokens=3),),
    paging=Paging(block_size=16),
    topk=8,
    block_n=8,
)
# A case the GPU fast path clears for our convert (tests/harness/check/test_views.py holds it to that).
GPU_SPEC = ConvertSpec(
    requests=(ConvertRequest(seq_len=500, num_tokens=4), ConvertRequest(seq_len=90, num_tokens=3)),
    paging=Paging(block_size=16, layout="shuffled"),
    topk=64,
    block_n=32,
    topk_mode="valid",
)


def _toy(seen: list[str]) -> Detector:
    """A detector no path knows: it files one INFO finding per case and notes the case it saw."""

    def run(ev: Evidence) -> list[Finding]:
        seen.append(ev.case.case_id)
        return [ev.ctx.finding("out", "toy", kind=Kind.VALUE_MISMATCH, severity=Severity.INFO, message="toy ran")]

    return Detector(name="toy", run=run, kinds=frozenset({Kind.VALUE_MISMATCH}))


def _session(seen: list[str]) -> Session:
    return Session(table=OPS, detectors=DETECTORS + (_toy(seen),))


def test_a_detector_added_to_the_session_runs_on_a_cpu_case():
    seen: list[str] = []
    s = _session(seen)
    case = materialize(SPEC, 5, "cpu")
    entry = s.entry("convert", "torch")
    result = run_case(session=s, case=case, entry=entry)
    assert seen == [case.case_id]
    assert [(f.cause, f.severity, f.case_id) for f in result.findings] == [("out:toy", Severity.INFO, case.case_id)]


def test_the_built_in_steps_alone_find_nothing_on_a_correct_implementation():
    case = materialize(SPEC, 5, "cpu")
    s = Session(table=OPS)
    assert run_case(session=s, case=case, entry=s.entry("convert", "torch"), rerun=True).findings == ()


def test_a_reviewed_step_after_an_unreviewed_one_is_refused():
    seen: list[str] = []
    late = Detector(name="late", run=lambda ev: [], kinds=frozenset(), reviewed=True)
    s = Session(table=OPS, detectors=DETECTORS + (_toy(seen), late))
    case = materialize(SPEC, 5, "cpu")
    with pytest.raises(ValueError, match="late"):
        run_case(session=s, case=case, entry=s.entry("convert", "torch"))


def test_every_step_has_a_unique_name_and_says_what_it_can_find():
    names = [d.name for d in DETECTORS]
    assert len(set(names)) == len(names)
    assert all(d.kinds for d in DETECTORS)


@pytest.mark.gpu
def test_a_detector_the_fast_path_does_not_cover_still_runs_after_its_clear(monkeypatch):
    """On the GPU our convert passes the fast path (Clear); the toy detector it does not cover still
    runs on that case (the case then goes down the full path), and without the toy the full path is
    never reached: the fast path covers every built-in step."""
    from mlafuzz.harness.check import full
    from mlafuzz.harness.drive import run
    from mlafuzz.harness.fast import path

    verdicts: list[object] = []
    fulls: list[str] = []
    fast_path, full_path = path.fast_path, run.full_path
    monkeypatch.setattr(path, "fast_path", lambda **kw: verdicts.append(fast_path(**kw)) or verdicts[-1])
    monkeypatch.setattr(run, "full_path", lambda **kw: fulls.append(kw["case"].case_id) or full_path(**kw))
    assert full.full_path is full_path

    case = materialize(GPU_SPEC, 3, "cuda")
    plain = Session(table=OPS)
    entry = plain.entry("convert", plain.default_ref("convert", "cuda"))
    assert run_case(session=plain, case=case, entry=entry, rerun=True).findings == ()
    assert [type(v) for v in verdicts] == [path.Clear] and fulls == []

    seen: list[str] = []
    s = _session(seen)
    assert path.uncovered(OPS.get("convert"), s.detectors) == ("toy",)
    result = run_case(session=s, case=case, entry=s.entry("convert", entry.name), rerun=True)
    assert [type(v) for v in verdicts] == [path.Clear, path.Clear]
    assert fulls == [case.case_id] and seen == [case.case_id]
    assert [f.cause for f in result.findings] == ["out:toy"]
