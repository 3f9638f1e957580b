"""The fast path judges convert's caller-owned outputs (SPEC 9.2) itself: our convert comes out
Clear, every caller-out mutant does not, and the full path then names the mutant's finding kind.

Runs the fast path itself (``fast=True``) under Triton's CPU interpreter on small drawn cases; on
the H200 the same tests run compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from mlafuzz.generators.draw import SMALL, Knobs  # noqa: E402
from mlafuzz.harness.fast.convert import convert_prefill  # noqa: E402
from mlafuzz.harness.fast.path import Clear  # noqa: E402
from mlafuzz.harness.ops.convert import compacts, oracle_inputs  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels.registry import default_registry  # noqa: E402
from mlafuzz.oracles import convert as oc  # noqa: E402
from mlafuzz.tests.support.helpers import fast_path_hides_nothing, fast_verdict, resolve, run_case  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CONVERT = OPS.get("convert")
# The caller-out group, and the row -1 look-alike (vllm-reports): a write into the caller's buffer
# outside its slice, which the guard zones must still catch on this path.
MUTANTS = sorted(
    e.name
    for e in default_registry().entries(mutants=True)
    if e.op == "convert" and (e.group == "caller-out" or e.name == "convert_out_row_minus1")
)


def _caller_cases(capabilities: frozenset[str], count: int, knobs: Knobs = SMALL) -> list:
    """The first ``count`` drawn cases with caller-owned outputs, as the fuzz loop gives them to an
    implementation with these capabilities (harness: Op.fit)."""
    found = []
    for seed in range(2000):
        spec = CONVERT.fit(OPS.draw_spec("convert", seed=seed, knobs=knobs), capabilities)
        if spec.caller_out is not None:
            found.append(OPS.materialize(spec, seed, DEV))
            if len(found) == count:
                return found
    raise AssertionError("too few caller-owned cases drawn")


def _oracle(case):
    return oc.convert(**oracle_inputs(case), compact_to_front=compacts(case))


def _prefill(case, out, counts, undecided):
    return convert_prefill(
        **oracle_inputs(case),
        out=out,
        valid_counts=counts,
        undecided=undecided,
    )


def test_the_prefill_leaves_no_element_at_any_value_the_row_expects_nor_any_count_right():
    """An element the call never writes cannot pass: in no row does any element hold -1 or one of
    the row's slots (a compacted row may put them in any order), and no count is right, nor
    right once the count is added into it (the wrapper's zeroing forgotten)."""
    everything = frozenset({"caller_out", "compact_to_front", "block_stride_rows"})
    for case in _caller_cases(everything, 12):
        expected, count = _oracle(case)
        out = torch.zeros_like(expected)
        counts = torch.zeros_like(count)
        undecided = torch.zeros(1, dtype=torch.int64, device=DEV)
        assert _prefill(case, out, counts, undecided)
        for row, want in zip(out.tolist(), expected.tolist()):
            assert not set(row) & (set(want) | {-1}), (case.case_id, row, want)
        assert not bool(((counts == count) | (counts == 0)).any()) and int(undecided) == 0


def test_a_row_expecting_both_int32_extremes_has_no_safe_fill_and_is_left_to_the_full_path():
    """A slot wraps to int32 as the kernel's does: a row whose slots reach both ends leaves no value
    below or above them, and the prefill says "cannot tell" (2) rather than fill weaker."""
    kw = dict(
        req_id=torch.zeros(2, dtype=torch.int32, device=DEV),
        token_indices=torch.tensor([[0, 1], [1, -1]], dtype=torch.int32, device=DEV),
        block_size=1,
        has_prefill_workspace=False,
        prefill_workspace_request_ids=None,
        prefill_workspace_starts=None,
        valid_counts=None,
    )
    out = torch.zeros(2, 2, dtype=torch.int32, device=DEV)
    undecided = torch.zeros(1, dtype=torch.int64, device=DEV)
    one_end = torch.tensor([[5, -(2**31)]], dtype=torch.int32, device=DEV)
    assert convert_prefill(block_table=one_end, out=out, undecided=undecided, **kw)
    # int32's least reached: above the greatest (5; then -1, the second row's slot and its padding)
    assert int(undecided) == 0 and out.tolist() == [[6, 6], [0, 0]]
    both = torch.tensor([[2**31 - 1, -(2**31)]], dtype=torch.int32, device=DEV)
    assert convert_prefill(block_table=both, out=out, undecided=undecided, **kw)
    assert int(undecided) == 2


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_our_convert_is_clear_on_the_fast_path_with_caller_owned_outputs_in_one_and_two_steps(impl):
    cases = _caller_cases(resolve("convert", impl).capabilities, 8)
    assert {c.params["out_steps"] for c in cases} == {1, 2}
    for i, case in enumerate(cases):
        result = fast_verdict(case, impl, rerun=i % 2 == 0)
        assert isinstance(result, Clear), (case.case_id, result)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_caller_out_mutant_is_never_clear_where_the_full_path_finds_it_and_is_named_by_its_kind(mutant):
    entry = resolve("convert", mutant)
    assert fast_path_hides_nothing(entry, _caller_cases(entry.capabilities, 8)), (
        f"{mutant}: no drawn case showed its bug"
    )


def test_a_compacted_row_in_another_order_on_the_re_run_is_not_clear(tmp_path):
    """Either order of a compacted row is right, but the write map holds two runs through the
    caller's buffer to the same bytes (NONDETERMINISM): so does the fast path's re-run."""
    path = tmp_path / "flipping.py"
    path.write_text(
        "import torch\n"
        "from mlafuzz.kernels.torch_impl import convert_torch\n"
        "CALLS = [0]\n"
        "def convert(*args, COMPACT_TO_FRONT=False, out=None, valid_counts_out=None, **kw):\n"
        "    kw.update(return_valid_counts=True, COMPACT_TO_FRONT=COMPACT_TO_FRONT)\n"
        "    res, counts = convert_torch(*args, **kw)\n"
        "    CALLS[0] += 1\n"
        "    if CALLS[0] % 2:  # every other call: each row's valid prefix reversed\n"
        "        for i, n in enumerate(counts.tolist()):\n"
        "            res[i, :n] = res[i, :n].flip(0)\n"
        "    out.copy_(res)\n"
        "    if valid_counts_out is None:\n"
        "        return out\n"
        "    valid_counts_out.copy_(counts)\n"
        "    return out, valid_counts_out\n"
    )
    ref = f"{path}:convert"
    entry = resolve("convert", ref)
    assert {"caller_out", "compact_to_front"} <= entry.capabilities
    case = next(
        c
        for c in _caller_cases(entry.capabilities, 40)
        if c.params.get("COMPACT_TO_FRONT") and c.params["out_steps"] == 1 and bool((_oracle(c)[1] > 1).any())
    )
    assert not isinstance(fast_verdict(case, ref, rerun=True), Clear)
    result = run_case(case=case, entry=entry, rerun=True, fast=True)
    assert result.skipped is None and "NONDETERMINISM" in {f.kind.value for f in result.findings}


@pytest.mark.gpu
def test_on_the_gpu_our_triton_convert_is_clear_on_caller_owned_cases_of_a_default_run():
    """The sizes a default run draws (Knobs()), compiled: each case judged by the fast path itself
    (Clear, so the full path never runs), and the full path agreeing on a few."""
    entry = resolve("convert", "triton")
    for i, case in enumerate(_caller_cases(entry.capabilities, 60, Knobs())):
        result = fast_verdict(case, "triton", rerun=i % 2 == 0)
        assert isinstance(result, Clear), (case.case_id, result)
        if i < 6:
            assert run_case(case=case, entry=entry, rerun=True, fast=False).findings == ()
