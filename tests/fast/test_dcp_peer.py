"""The fast path judges dcp_peer itself (harness/fast/dcp_peer.py): our torch map comes out Clear on
a default run's cases, caller-owned outputs or not, in one step or two; no dcp_peer mutant is Clear
where the full path finds it; and a case makes far fewer device operations than the full path.

Runs the fast path itself (``fast=True``) under Triton's CPU interpreter (the fingerprints are
Triton kernels); on the H200 the same tests run compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from mlafuzz.generators.draw import Knobs  # noqa: E402
from mlafuzz.harness.fast.path import Clear  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels.registry import default_registry  # noqa: E402
from mlafuzz.tests.support.helpers import fast_path_hides_nothing, fast_verdict, resolve, run_case  # noqa: E402
from tests.support.launches import counting_work  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PEER = OPS.get("dcp_peer")
MUTANTS = sorted(e.name for e in default_registry().entries(mutants=True) if e.op == "dcp_peer")


def _cases(capabilities: frozenset[str], count: int, knobs: Knobs | None = None) -> list:
    """The first ``count`` drawn cases (a default run's sizes unless ``knobs``), as the fuzz loop
    gives them to an implementation with these capabilities."""
    return [
        OPS.materialize(PEER.fit(OPS.draw_spec("dcp_peer", seed=seed, knobs=knobs or Knobs()), capabilities), seed, DEV)
        for seed in range(count)
    ]


def test_our_torch_dcp_peer_is_clear_on_the_fast_path_on_a_default_runs_cases_caller_owned_or_not():
    cases = _cases(resolve("dcp_peer", "torch").capabilities, 200)
    assert {c.params.get("out_steps") for c in cases} == {None, 1, 2}
    for i, case in enumerate(cases):
        result = fast_verdict(case, "torch", rerun=i % 2 == 0)
        assert isinstance(result, Clear), (case.case_id, result)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_no_dcp_peer_mutant_is_clear_on_the_fast_path_where_the_full_path_finds_it(mutant):
    entry = resolve("dcp_peer", mutant)
    named = fast_path_hides_nothing(entry, _cases(entry.capabilities, 30))
    # no_space_check differs only on inputs the host check rejects: no valid case shows it
    assert named or entry.expected_kind == "ACCEPTED_INVALID_INPUT", f"{mutant}: no drawn case showed its bug"


def _mean_work(cases: list, *, fast: bool) -> float:
    """The mean count of a case's device operations made by the harness (the implementation's
    own, the same on either path, left out), the first case left out (loads and pools made once)."""
    entry = resolve("dcp_peer", "torch")
    run_case(case=cases[0], entry=entry, fast=fast, rerun=True)
    total = 0
    for case in cases[1:]:
        with counting_work() as work:
            assert not run_case(case=case, entry=entry, fast=fast, rerun=True).findings
        total += work.total - sum(n for site, n in work.sites.items() if site.startswith("kernels/"))
    return total / (len(cases) - 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the Triton interpreter's launches (a CPU run)")
def test_a_fast_path_dcp_peer_case_makes_few_device_operations_against_the_full_paths():
    """Each launch and copy is a context's turn on a GPU shared by eight workers (issue 27): the
    harness's own operations of a fast-path case (the oracle, one comparison, the fingerprints,
    the guarded buffers, one read; 37 measured) stay under a ceiling, and well under the full
    path's (input clones, copied run, oracle, comparator, detectors; 66 measured)."""
    cases = _cases(resolve("dcp_peer", "torch").capabilities, 13)
    fast, full = _mean_work(cases, fast=True), _mean_work(cases, fast=False)
    assert fast <= 42 and fast <= 0.65 * full, (fast, full)


def test_a_caller_owned_count_added_into_the_buffer_instead_of_stored_is_never_clear(tmp_path):
    """The prefill keeps each run's fill where its word is no correct value nor one once counts
    are added into it: a map that adds its counts into ``valid_counts_out`` (its zeroing
    forgotten) shows, on the first run and on the re-run's other fill alike."""
    path = tmp_path / "adding.py"
    path.write_text(
        "from mlafuzz.kernels.torch_impl import dcp_peer_slots_torch\n"
        "def dcp_peer(*args, out=None, valid_counts_out=None, **kw):\n"
        "    kw['return_valid_counts'] = True\n"
        "    res, counts = dcp_peer_slots_torch(*args, **kw)\n"
        "    if out is None:\n"
        "        return res, counts\n"
        "    out.copy_(res)\n"
        "    if valid_counts_out is None:\n"
        "        return out\n"
        "    valid_counts_out.add_(counts)\n"
        "    return out, valid_counts_out\n"
    )
    ref = f"{path}:dcp_peer"
    entry = resolve("dcp_peer", ref)
    cases = [
        c
        for c in _cases(entry.capabilities | {"caller_out"}, 80)
        if "out_steps" in c.params and c.params["return_valid_counts"] and c.tensors["token_indices"].shape[0]
    ]
    assert len(cases) >= 4
    for i, case in enumerate(cases):
        assert not isinstance(fast_verdict(case, ref, rerun=i % 2 == 0), Clear), case.case_id
