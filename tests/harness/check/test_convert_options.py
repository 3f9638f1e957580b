"""SPEC section 7's convert options through the harness: drawn only for implementations that have
them, a counted skip where a given spec needs one, compacted rows judged as multisets."""

from __future__ import annotations

from pathlib import Path

import torch

from mlafuzz.generators.draw import SMALL
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.check.calls import Call
from mlafuzz.harness.check.compare import Context, Policy, compare
from mlafuzz.harness.check.detectors import rerun_differs
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.tasks import Task, execute
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.findings import Kind

PLANTED = Path(__file__).parents[2] / "support" / "planted"
OLD = f"{PLANTED / 'old_convert.py'}:convert"
SHUFFLED = f"{PLANTED / 'old_convert.py'}:shuffled_compact"
CTX = Context(op="convert", impl="planted", case_id="c0")
# The planted converts keep a counted row in place unless asked to compact, as vLLM up to 0.29: the
# newest revision whose convert_counted rule is in_place is theirs.
IN_PLACE = "2026-10"


def _seed_with_both_options() -> int:
    def both(s) -> bool:
        return s.compact and s.block_stride_rows is not None and s.block_stride_rows > s.paging.block_size

    return next(i for i in range(500) if both(OPS.draw_spec("convert", seed=i, knobs=SMALL)))


def test_drawn_options_go_only_to_implementations_whose_signature_has_them():
    s = Session(table=OPS)
    assert s.entry("convert", OLD).capabilities == frozenset()
    seed = _seed_with_both_options()
    for ref, options in (("torch", {"compact", "stride:padded"}), (OLD, set())):
        result = execute(Task(index=0, op="convert", seed=seed, impl_ref=ref, device="cpu", revision=IN_PLACE), s)
        assert result.skipped is None and result.findings == ()
        assert options <= set(result.features) and not (set(result.features) - options) & {
            "compact",
            "stride:padded",
            "stride:block_size",
        }


def test_a_given_spec_that_needs_an_option_is_a_counted_skip_not_a_finding():
    s = Session(table=OPS)
    spec = spec_to_dict(OPS.draw_spec("convert", seed=_seed_with_both_options(), knobs=SMALL))
    result = execute(Task(index=0, op="convert", seed=1, impl_ref=OLD, device="cpu", spec=spec), s)
    assert result.findings == () and "block_stride_rows" in result.skipped and "compact_to_front" in result.skipped


def test_an_old_signature_and_an_unordered_compaction_draw_nothing_and_skip_nothing(tmp_path):
    for ref in (OLD, SHUFFLED):
        config = FuzzConfig(
            ops=("convert",),
            impls={"convert": ref},
            device="cpu",
            cases=30,
            seed=5,
            out_dir=tmp_path / ref.rsplit(":", 1)[1],
            rerun_every=1,
            revision=IN_PLACE,
        )  # every case run twice
        summary = fuzz(config, executor=InProcess(session=Session(table=OPS)))
        assert summary.cases == 30 and summary.skipped == 0 and summary.findings == 0, summary.by_kind
    assert summary.coverage["compact"]  # the shuffled one got compacted cases


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.int32)


def test_row_set_mode_accepts_any_order_and_finds_a_wrong_multiset_or_tail():
    exp, counts = _rows([5, 7, 7, -1], [3, -1, -1, -1]), torch.tensor([3, 1], dtype=torch.int32)
    run = lambda act: compare(
        expected={"out": exp}, actual={"out": act}, policy=Policy(), ctx=CTX, row_sets={"out": counts}
    )
    assert run(_rows([7, 5, 7, -1], [3, -1, -1, -1])) == []
    (f,) = run(_rows([7, 5, 5, -1], [3, -1, -1, -1]))  # one 7 became a 5
    assert f.kind is Kind.VALUE_MISMATCH and f.cause == "out:row_set" and f.count == 1 and f.total == 2
    assert "missing 7" in f.mismatches[0].actual and "unexpected 5" in f.mismatches[0].actual
    (f,) = run(_rows([5, 7, 7, -1], [-1, 3, -1, -1]))  # the slot is not at the front
    assert f.mismatches[0].index == (1,) and "tail" in f.mismatches[0].actual
    # Without the mode the same reordered row is an element mismatch.
    assert (
        compare(expected={"out": exp}, actual={"out": _rows([7, 5, 7, -1], [3, -1, -1, -1])}, policy=Policy(), ctx=CTX)[
            0
        ].cause
        == "out:value"
    )


def test_a_rerun_in_another_order_is_not_nondeterminism_but_other_slots_are():
    def call(out):
        return Call(outputs={"out": out}, inputs={}, guards={}, error=None)

    a = _rows([5, 7, 9, -1])
    assert rerun_differs(call(a), call(_rows([9, 5, 7, -1])), CTX, unordered={"out"}) == []
    assert rerun_differs(call(a), call(_rows([9, 5, 7, -1])), CTX)[0].kind is Kind.NONDETERMINISM
    assert rerun_differs(call(a), call(_rows([9, 5, 8, -1])), CTX, unordered={"out"})[0].kind is Kind.NONDETERMINISM
