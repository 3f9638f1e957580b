"""The fast path judges dcp itself (harness/fast/dcp.py): our Triton and torch filters come out Clear
on a default run's cases, compacted or not; a compacted row is judged as the full path's row-set
compare judges it (any order in the valid prefix, -1 after); no dcp mutant is Clear where the full
path finds it; the check reads nothing back to the host; and a case makes far fewer device
operations than the full path.

Runs the fast path itself (``fast=True``) under Triton's CPU interpreter (the fingerprints and our
filter are Triton kernels); on the H200 the same tests run compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from mlafuzz.generators.draw import Knobs  # noqa: E402
from mlafuzz.harness.fast import dcp as fast_dcp  # noqa: E402
from mlafuzz.harness.fast.path import Clear  # noqa: E402
from mlafuzz.harness.ops.dcp import compacts  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels.registry import default_registry  # noqa: E402
from mlafuzz.oracles.convert import rows_as_sets_equal  # noqa: E402
from mlafuzz.tests.support.helpers import fast_path_hides_nothing, fast_verdict, resolve, run_case  # noqa: E402
from tests.support.launches import counting_work  # noqa: E402
from tests.support.syncs import counting, cuda_syncs  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DCP = OPS.get("dcp")
MUTANTS = sorted(e.name for e in default_registry().entries(mutants=True) if e.op == "dcp")


def _cases(count: int, start: int = 0, *, capabilities: frozenset[str] = frozenset({"block_stride_rows"})) -> list:
    """Drawn cases of a default run's sizes, seeds ``start`` on, fitted to ``capabilities`` (ours:
    the filter's BLOCK_STRIDE_ROWS; the mutants have none)."""
    return [
        OPS.materialize(DCP.fit(OPS.draw_spec("dcp", seed=s, knobs=Knobs()), capabilities), s, DEV)
        for s in range(start, start + count)
    ]


@pytest.mark.parametrize("impl,count", [("torch", 100), ("triton", 100)])
def test_our_dcp_filters_are_clear_on_the_fast_path_on_a_default_runs_cases_compacted_or_not(impl, count):
    cases = _cases(count)
    kinds = {(c.params["compact_valid_to_front"], c.params["return_valid_counts"]) for c in cases}
    assert kinds == {(True, True), (True, False), (False, True), (False, False)}
    for i, case in enumerate(cases):
        result = fast_verdict(case, impl, rerun=i % 2 == 0)
        assert isinstance(result, Clear), (case.case_id, result)


def _verdict(case, out: torch.Tensor, counts: torch.Tensor | None = None, second=None) -> int:
    """The check's flag for ``out`` (and ``counts``, default the oracle's) as a run's outputs of
    ``case``; ``second``: a re-run's (its counts the oracle's)."""
    exp = DCP.oracle(case)
    runs = {**exp, "out": out, **({"valid_counts": counts} if counts is not None else {})}
    second = None if second is None else {**exp, **second}
    flag = torch.zeros(2, dtype=torch.int64, device=DEV)
    assert fast_dcp.check(case, runs, second, flag, state=None)
    return int(flag[0])


def _compacted(count: int) -> list:
    """Compacted cases with some valid and some invalid columns in a row."""
    cases = []
    for case in _cases(200, start=1000):
        out = DCP.oracle(case)["out"]
        if compacts(case) and (out[:, 0] != -1).any() and (out[:, -1] == -1).any():
            cases.append(case)
        if len(cases) == count:
            return cases
    raise AssertionError(f"only {len(cases)} compacted cases with valid and invalid columns")


def test_a_compacted_row_is_judged_as_the_full_paths_row_set_compare_judges_it():
    """A prefix in any order passes; a valid value moved into the -1 tail, or one replaced by a
    value that is not the oracle's, does not; the rows' verdicts agree with ``rows_as_sets_equal``."""
    for case in _compacted(8):
        exp = DCP.oracle(case)
        want, counts = exp["out"], DCP.row_sets(case, exp)["out"]
        k = want.shape[1]
        cols = torch.arange(k, device=DEV)
        front = cols < counts.unsqueeze(1)
        # Each row's prefix reversed (its tail kept): the same multiset in another order.
        flipped = torch.where(front, (counts.unsqueeze(1) - 1 - cols).clamp(min=0), cols)
        shuffled = want.gather(1, flipped.long())
        row = int((counts > 0).nonzero()[0])
        moved = want.clone()  # the last valid value of a row pushed one column into its tail
        c = int(counts[row])
        moved[row, c - 1], moved[row, c % k] = -1, want[row, c - 1]
        other = want.clone()
        other[row, 0] = want[row, 0] + 1 if int(want[row, 0]) != 2**31 - 1 else 0
        for got, ok in ((shuffled, True), (moved, c == k), (other, False)):
            assert bool(rows_as_sets_equal(expected=want, actual=got, counts=counts).all()) == ok, case.case_id
            assert _verdict(case, got) == (0 if ok else 1), case.case_id
            # the same judgement of a second run, whatever the first's
            assert _verdict(case, shuffled, second={"out": got}) == (0 if ok else 1), case.case_id


def test_a_wrong_count_or_an_unsorted_uncompacted_row_is_flagged():
    cases = [c for c in _cases(60) if c.tensors["token_indices"].shape[0]]
    plain = next(c for c in cases if not c.params["compact_valid_to_front"] and (DCP.oracle(c)["out"] != -1).any())
    want = DCP.oracle(plain)["out"]
    assert _verdict(plain, want) == 0
    assert _verdict(plain, want.flip(1)) == int(not torch.equal(want, want.flip(1)))
    counted = next(c for c in cases if c.params["return_valid_counts"])
    exp = DCP.oracle(counted)
    assert _verdict(counted, exp["out"], exp["valid_counts"]) == 0
    assert _verdict(counted, exp["out"], exp["valid_counts"] + 1) == 1


def test_the_check_reads_nothing_back_to_the_host():
    """Oracle and comparison are torch ops on the case's device: no sync of their own (the path's
    one read of the board is the case's only one)."""
    for case in _cases(12):
        exp = DCP.oracle(case)
        flag = torch.zeros(2, dtype=torch.int64, device=DEV)
        with counting() as count:
            assert fast_dcp.check(case, exp, None, flag, state=None)
        assert count.total == 0, (case.case_id, dict(count.sites))


@pytest.mark.gpu
def test_on_the_gpu_the_check_makes_no_cuda_sync():
    """CUDA's own count (torch's sync debug mode warns at every blocking copy and stream sync): the
    oracle's indexing, where and sum, and the comparison's sorts, read nothing back."""
    import warnings

    cases = _cases(12)
    flags = [torch.zeros(2, dtype=torch.int64, device=DEV) for _ in cases]
    expected = [DCP.oracle(case) for case in cases]
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for case, exp, flag in zip(cases, expected, flags):
                assert fast_dcp.check(case, exp, exp, flag, state=None)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert cuda_syncs(seen) == 0
    assert not any(int(f[0]) for f in flags)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_no_dcp_mutant_is_clear_on_the_fast_path_where_the_full_path_finds_it(mutant):
    entry = resolve("dcp", mutant)
    named = fast_path_hides_nothing(entry, _cases(30, capabilities=frozenset()))
    # no_length_check differs only on inputs the host check rejects: no valid case shows it
    assert named or entry.expected_kind == "ACCEPTED_INVALID_INPUT", f"{mutant}: no drawn case showed its bug"


def _mean_work(cases: list, *, fast: bool) -> float:
    """The mean count of a case's device operations made by the harness (the implementation's
    own, the same on either path, left out), the first case left out (loads and pools made once)."""
    entry = resolve("dcp", "torch")
    run_case(case=cases[0], entry=entry, fast=fast, rerun=True)
    total = 0
    for case in cases[1:]:
        with counting_work() as work:
            assert not run_case(case=case, entry=entry, fast=fast, rerun=True).findings
        total += work.total - sum(n for site, n in work.sites.items() if site.startswith("kernels/"))
    return total / (len(cases) - 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the Triton interpreter's launches (a CPU run)")
def test_a_fast_path_dcp_case_makes_few_device_operations_against_the_full_paths():
    """Each launch and copy is a context's turn on a GPU shared by eight workers (issue 27): the
    harness's own operations of a fast-path case (the oracle, the comparison, the fingerprints,
    one read; 36.5 measured) stay under a ceiling, and well under the full path's (input clones,
    copied run, oracle, comparator, detectors; 52.8 measured: since D = 1 is drawn, a quarter of
    the cases are the plain convert's in-place rows, which the full path compares without its
    row-set mode, so the full path's mean fell from 63 and the ratio rose from 0.62 to 0.69)."""
    cases = _cases(13)
    fast, full = _mean_work(cases, fast=True), _mean_work(cases, fast=False)
    assert fast <= 42 and fast <= 0.72 * full, (fast, full)
