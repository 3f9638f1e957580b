"""SPEC 9.2's caller-owned convert outputs through the harness: drawn for implementations whose
signature takes ``out`` / ``valid_counts_out``, judged by the write map and guard zones, and a
returned tensor other than the caller's is a finding."""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from mlafuzz.generators.draw import SMALL  # noqa: E402
from mlafuzz.harness.check.session import Session  # noqa: E402
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz  # noqa: E402
from mlafuzz.harness.drive.run import run_case  # noqa: E402
from mlafuzz.harness.drive.workers import InProcess  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels.external import adapt_signature  # noqa: E402
from mlafuzz.kernels.torch_impl import convert_torch  # noqa: E402

PLANTED = Path(__file__).parents[2] / "support" / "planted"
OLD = f"{PLANTED / 'old_convert.py'}:convert"


def _fuzz(tmp_path, op: str, impl: str, cases: int):
    config = FuzzConfig(ops=(op,), impls={op: impl}, device="cpu", cases=cases, seed=3, out_dir=tmp_path / impl)
    return fuzz(config, executor=InProcess(session=Session(table=OPS)))


@pytest.mark.parametrize("op", ["convert", "dcp_peer"])
def test_our_torch_implementations_write_every_caller_element_and_return_the_callers_buffers(tmp_path, op):
    summary = _fuzz(tmp_path, op, "torch", 90)
    assert summary.cases == 90 and summary.findings == 0, summary.by_kind
    assert summary.coverage["caller-out"] >= 15 and summary.coverage["caller-out:2-steps"] >= 5


def test_our_triton_convert_under_the_interpreter_writes_the_callers_buffers(tmp_path):
    summary = _fuzz(tmp_path, "convert", "triton", 24)
    assert summary.findings == 0, summary.by_kind
    assert summary.coverage["caller-out"] >= 4


def test_a_signature_with_out_and_valid_counts_out_has_the_capability_and_an_older_one_does_not():
    assert "caller_out" in adapt_signature("convert", convert_torch)[1]
    assert "caller_out" not in Session(table=OPS).entry("convert", OLD).capabilities


def _caller_out_case(steps: int, compact: bool = False):
    for seed in range(400):
        # As the fuzz loop gives it to an implementation with these options (harness: Op.fit).
        caps = frozenset({"caller_out", "compact_to_front"} if compact else {"caller_out"})
        spec = OPS.get("convert").fit(OPS.draw_spec("convert", seed=seed, knobs=SMALL), caps)
        c = spec.caller_out
        if c is not None and c.steps == steps and spec.return_valid_counts and spec.compact is compact:
            return OPS.materialize(spec, seed, "cpu")
    raise AssertionError("no such case drawn")


def test_the_callers_out_is_a_row_slice_of_a_filled_buffer_with_guarded_rows_around_it():
    case = _caller_out_case(steps=2)
    guards = OPS.get("convert").guarded(case, 0xA5)
    out = guards["out"]
    n, k = case.tensors["token_indices"].shape
    assert tuple(out.view.shape) == (n, k) and out.view.dtype == torch.int32
    assert bool((out.view == -1515870811).all())  # 0xA5A5A5A5: neither -1 nor a slot in both runs
    assert "valid_counts" in guards and case.tensors["prev_token_indices"].shape == (n, k)


def test_no_row_of_the_step_before_holds_the_values_this_step_should_write_in_any_order():
    """A two-step case's first call leaves, in every row that can hold a valid column, another
    count of valid values than the second should write: a compacted row (any order is right) left
    from the step before cannot pass for this step's. Reversed columns: an invalid column now was
    mostly valid then."""
    from mlafuzz.oracles.convert import convert

    checked = 0
    for seed in range(300):
        spec = OPS.get("convert").fit(OPS.draw_spec("convert", seed=seed, knobs=SMALL), frozenset({"caller_out"}))
        if spec.caller_out is None or spec.caller_out.steps != 2:
            continue
        case = OPS.materialize(spec, seed, "cpu")
        t, p = case.tensors, case.params
        counts = [
            convert(
                req_id=t["req_id"],
                block_table=t["block_table"],
                token_indices=ti,
                block_size=p["BLOCK_SIZE"],
                has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
                prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
                prefill_workspace_starts=t["prefill_workspace_starts"],
            )[1]
            for ti in (t["prev_token_indices"], t["token_indices"])
        ]
        can = t["block_table"].shape[1] > 0
        assert bool((counts[0] != counts[1]).all()) if can else torch.equal(*counts), case.case_id
        changed = (t["prev_token_indices"].flip(1) != t["token_indices"]).sum(dim=1)
        assert bool((changed == (1 if can else 0)).all()), case.case_id  # else the same columns, reversed
        checked += 1
    assert checked >= 20


def _planted(tmp_path, body: str):
    path = tmp_path / "planted_out.py"
    path.write_text(
        "from mlafuzz.kernels.torch_impl import convert_torch\n"
        "def convert(*args, out=None, valid_counts_out=None, **kw):\n" + body
    )
    return f"{path}:convert"


def test_a_fresh_tensor_returned_instead_of_the_callers_out_is_a_finding(tmp_path):
    ref = _planted(tmp_path, "    return convert_torch(*args, **kw)\n")
    entry = Session(table=OPS).entry("convert", ref)
    result = run_case(session=Session(table=OPS), case=_caller_out_case(steps=1), entry=entry)
    causes = {f.cause for f in result.findings}
    assert {"out:not_callers", "valid_counts:not_callers", "out:missing"} <= causes, causes


def test_a_value_left_from_the_step_before_is_a_missing_write_of_this_step(tmp_path):
    # Writes only the valid columns of the last step: the first step's values survive there.
    ref = _planted(
        tmp_path,
        "    res, counts = convert_torch(*args, **{**kw, 'return_valid_counts': True})\n"
        "    out[res != -1] = res[res != -1]\n"
        "    valid_counts_out.copy_(counts)\n"
        "    return out, valid_counts_out\n",
    )
    entry = Session(table=OPS).entry("convert", ref)
    case = _caller_out_case(steps=2)  # counted rows kept in place: judged under the last revision that does
    case = dataclasses.replace(case, params={**case.params, "revision": "2026-10"})
    result = run_case(session=Session(table=OPS), case=case, entry=entry)
    kinds = {(f.kind.value, f.cause) for f in result.findings}
    assert kinds == {("MISSING_WRITE", "out:missing")}, result.findings


def test_a_compacted_row_left_whole_from_the_step_before_is_a_missing_write_of_this_step():
    # The catalog's mutant: a second compacted call through the same out= writes none of its rows.
    entry = Session(table=OPS).entry("convert", "convert_out_stale_compacted")
    result = run_case(session=Session(table=OPS), case=_caller_out_case(steps=2, compact=True), entry=entry)
    kinds = {(f.kind.value, f.cause) for f in result.findings}
    assert kinds == {("MISSING_WRITE", "out:missing")}, result.findings
