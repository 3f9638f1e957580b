"""The comparator: bit-exact by default, NaN by position, ulp budget, subnormal flush, messages."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.harness.check.compare import Context, Policy, compare
from mlafuzz.reports.findings import Finding, Kind

CTX = Context(op="gather", impl="planted", case_id="c0")


def _bf16(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(1, -1)


def _run(exp, act, ulp=0):
    return compare(expected={"dst": exp}, actual={"dst": act}, policy=Policy(ulp=ulp), ctx=CTX)


def test_identical_bits_give_no_finding_even_with_nans():
    x = _bf16([0x3F80, 0x7FC0, 0xFFC1, 0x0001])
    assert _run(x, x.clone()) == []


def test_one_ulp_off_is_a_value_mismatch_with_torch_testing_style_message():
    exp = _bf16([0x3F80, 0x4000, 0x4040, 0x4080])
    act = _bf16([0x3F80, 0x4000, 0x4041, 0x4080])
    (f,) = _run(exp, act)
    assert f.kind is Kind.VALUE_MISMATCH and f.count == 1 and f.total == 4 and f.max_ulp == 1
    assert "Mismatched elements: 1 / 4 (25.0%)" in f.message
    assert "greatest ulp distance 1 at [0, 2] (expected 0x4040, got 0x4041)" in f.message


def test_ulp_policy_accepts_differences_within_budget_only():
    exp = _bf16([0x4040, 0x4040])
    act = _bf16([0x4042, 0x4045])
    (f,) = _run(exp, act, ulp=2)
    assert f.count == 1 and f.max_ulp == 5


def test_signed_zero_counts_in_bit_exact_mode():
    (f,) = _run(_bf16([0x8000]), _bf16([0x0000]))
    assert f.kind is Kind.VALUE_MISMATCH


def test_nan_where_oracle_has_none_is_a_nan_mismatch_not_a_value_mismatch():
    exp = _bf16([0x3F80, 0x7FC0])
    act = _bf16([0x7FC0, 0x7FC0])
    (f,) = _run(exp, act)
    assert f.kind is Kind.NAN_MISMATCH and f.mismatches[0].index == (0, 0)


def test_wrong_values_with_nan_positions_among_them_are_one_value_mismatch():
    # Data read from the wrong place holds NaN codes too: one cause, one finding, every element counted.
    exp = _bf16([0x3F80, 0x7FC0, 0x4000])
    act = _bf16([0x7FC0, 0x3F80, 0x4040])
    (f,) = _run(exp, act)
    assert f.kind is Kind.VALUE_MISMATCH and f.count == 3 and "NaN positions differ at 2 more" in f.message


def test_nan_payload_and_sign_do_not_matter():
    assert _run(_bf16([0x7FC0]), _bf16([0xFFFF])) == []


def test_flushed_subnormals_are_reported_as_subnormal_flush():
    exp = _bf16([0x0001, 0x8003, 0x3F80])
    act = _bf16([0x0000, 0x8000, 0x3F80])
    (f,) = _run(exp, act)
    assert f.kind is Kind.SUBNORMAL_FLUSH and "subnormal" in f.message


def test_a_flush_mixed_with_a_normal_error_is_a_value_mismatch():
    (f,) = _run(_bf16([0x0001, 0x3F80]), _bf16([0x0000, 0x3F81]))
    assert f.kind is Kind.VALUE_MISMATCH


def test_integer_outputs_compare_exactly_and_name_the_first_index():
    exp = torch.tensor([[1, 2, -1], [4, 5, 6]], dtype=torch.int32)
    act = exp.clone()
    act[1, 2] = 7
    (f,) = compare(expected={"out": exp}, actual={"out": act}, policy=Policy(), ctx=CTX)
    assert f.kind is Kind.VALUE_MISMATCH and f.mismatches[0].index == (1, 2)
    assert "expected 6, got 7" in f.message


def test_wrong_shape_or_missing_output_is_reported_not_raised():
    exp = torch.zeros((2, 3), dtype=torch.int32)
    (f,) = compare(
        expected={"out": exp}, actual={"out": torch.zeros((3, 3), dtype=torch.int32)}, policy=Policy(), ctx=CTX
    )
    assert "shape" in f.message
    (g,) = compare(expected={"out": exp}, actual={}, policy=Policy(), ctx=CTX)
    assert g.kind is Kind.VALUE_MISMATCH


def test_findings_round_trip_through_json():
    (f,) = _run(_bf16([0x3F80]), _bf16([0x3F81]))
    assert Finding.from_json(f.to_json()) == f


def test_policy_rejects_negative_ulp():
    with pytest.raises(ValueError, match="ulp=-1"):
        Policy(ulp=-1)


def _metadata(**changed) -> dict[str, torch.Tensor]:
    out = {
        "count": torch.tensor(3, dtype=torch.int32),
        "ids": torch.arange(7, dtype=torch.int32),
        "plan": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "flags": torch.tensor([True, False]),
        "scale": torch.tensor([1.5, -0.0], dtype=torch.float32),
        "empty": torch.zeros((0, 2), dtype=torch.int32),
        "rows": torch.zeros((64, 576), dtype=torch.bfloat16),  # past the size compared together
    }
    return {**out, **changed}


def test_many_small_outputs_report_exactly_the_one_that_differs():
    exp = _metadata()
    assert compare(expected=exp, actual=_metadata(), policy=Policy(), ctx=CTX) == []
    for name, wrong in [
        ("count", torch.tensor(4, dtype=torch.int32)),
        ("ids", torch.tensor([0, 1, 2, 3, 4, 5, 5], dtype=torch.int32)),
        ("plan", torch.arange(12, dtype=torch.int64).reshape(3, 4).flip(0)),
        ("flags", torch.tensor([True, True])),
        ("scale", torch.tensor([1.5, 0.0], dtype=torch.float32)),  # a sign flip on zero is a bit difference
    ]:
        (f,) = compare(expected=exp, actual=_metadata(**{name: wrong}), policy=Policy(), ctx=CTX)
        assert f.tensor == name and f.kind is Kind.VALUE_MISMATCH, (name, f)
    # Two wrong among them: two findings, each named.
    both = _metadata(count=torch.tensor(0, dtype=torch.int32), rows=torch.ones((64, 576), dtype=torch.bfloat16))
    assert sorted(f.tensor for f in compare(expected=exp, actual=both, policy=Policy(), ctx=CTX)) == ["count", "rows"]
