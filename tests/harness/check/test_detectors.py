"""Each finding kind: a planted implementation triggers it, the correct one on the same case does not."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.ops.step import StepRequest, StepSpec
from mlafuzz.generators.spec import Paging, ValueMode
from mlafuzz.reports.findings import Kind
from mlafuzz.tests.support.helpers import INVALID_CLASSES, check_contract, materialize, resolve, run_case

FAST_DEV = "cuda" if torch.cuda.is_available() else "cpu"  # where the fused Triton checks run
REQS = (GatherRequest(context_len=70, seq_start=3, length=40), GatherRequest(context_len=20, length=20))


def _gather(values: ValueMode) -> GatherSpec:
    return GatherSpec(requests=REQS, paging=Paging(block_size=16), values=values)


@pytest.mark.parametrize(
    "mutant, values, kind",
    [
        ("gather_truncate_bf16", ValueMode.ACTIVATIONS, Kind.VALUE_MISMATCH),
        ("gather_nan_to_zero", ValueMode.NAN, Kind.NAN_MISMATCH),
        ("gather_flush_subnormal", ValueMode.SUBNORMAL, Kind.SUBNORMAL_FLUSH),
        ("gather_one_row_too_far", ValueMode.ACTIVATIONS, Kind.OOB_WRITE),
        ("gather_skip_last_row", ValueMode.ACTIVATIONS, Kind.MISSING_WRITE),
        ("gather_mutates_cache", ValueMode.ACTIVATIONS, Kind.INPUT_MUTATION),
        ("gather_nondeterministic", ValueMode.ACTIVATIONS, Kind.NONDETERMINISM),
    ],
)
@pytest.mark.parametrize(
    "fast, room",
    [
        pytest.param(False, "1", id="oracle"),
        # Under the CPU interpreter the fused checks are slow; the GPU stage runs them (.ci/gpu fasttests).
        pytest.param(True, "1", id="fused-check", marks=pytest.mark.slow),
        pytest.param(True, "0", id="fast-room-off"),
    ],
)
def test_planted_gather_draws_its_kind_and_the_torch_gather_does_not(mutant, values, kind, fast, room, monkeypatch):
    """fused-check: the GPU's path, where the fused check of both runs stands in for the oracle,
    the comparator and the write map whenever it says yes (on CPU under the interpreter).
    fast-room-off: the fast path asked for but switched off (MLAFUZZ_FAST=0, as if the room were
    deleted): every detector still fires, by the full path."""
    monkeypatch.setenv("MLAFUZZ_FAST", room)
    case = materialize(_gather(values), 3, FAST_DEV if fast else "cpu")
    bad = run_case(case=case, entry=resolve("gather", mutant), rerun=True, fast=fast)
    assert kind in {f.kind for f in bad.findings}, [f.message for f in bad.findings]
    good = run_case(case=case, entry=resolve("gather", "torch"), rerun=True, fast=fast)
    assert good.findings == ()


def test_among_a_cases_small_inputs_only_the_one_a_call_changed_is_input_mutation():
    """Small inputs are compared side by side in one check; the finding still names each changed one."""
    from mlafuzz.harness.check.compare import Context
    from mlafuzz.harness.check.detectors import input_mutations

    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, "cpu")
    ctx = Context(op="gather", impl="planted", case_id="c0")
    assert input_mutations(case, case.cloned_tensors(), ctx, inplace=frozenset()) == []
    small = [n for n, t in case.tensors.items() if t is not None and t.numel() * t.element_size() <= 1 << 16]
    assert len(small) >= 2
    for name in small:
        inputs = case.cloned_tensors()
        inputs[name].view(torch.uint8).reshape(-1)[-1] ^= 1
        (f,) = input_mutations(case, inputs, ctx, inplace=frozenset())
        assert f.kind is Kind.INPUT_MUTATION and f.tensor == name and f.count == 1, (name, f.message)


def test_an_impl_that_skips_a_promised_check_is_accepted_invalid_input_and_a_checking_one_is_not():
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, "cpu")
    klass = next(k for k in INVALID_CLASSES["gather"] if k.name == "ws0_nonzero")
    for name, expect in (("gather_no_value_checks", {Kind.ACCEPTED_INVALID_INPUT}), ("torch", set())):
        entry = resolve("gather", name)
        found = check_contract(case=case, entry=entry, fn=entry.load("cpu"), klass=klass)
        assert {f.kind for f in found} == expect


def test_a_class_outside_the_contract_is_info_and_never_fails():
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, "cpu")
    klass = next(k for k in INVALID_CLASSES["gather"] if k.name == "ws0_nonzero")
    entry = dataclasses.replace(resolve("gather", "gather_no_value_checks"), rejects=frozenset())
    (finding,) = check_contract(case=case, entry=entry, fn=entry.load("cpu"), klass=klass)
    assert finding.kind is Kind.ACCEPTED_INVALID_INPUT and finding.severity.value == "info"


def test_an_impl_raising_on_a_valid_input_is_an_exception_finding(tmp_path):
    path = tmp_path / "raises.py"
    path.write_text("def gather(*args, **kwargs):\n    raise RuntimeError('illegal memory access')\n")
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, "cpu")
    (finding,) = run_case(case=case, entry=resolve("gather", f"{path}:gather")).findings
    assert finding.kind is Kind.EXCEPTION and "illegal memory access" in finding.message


def test_a_step_that_converts_the_full_req_id_is_a_metadata_mismatch_and_ours_is_clean():
    # One decode and one short prefill: the step that triggered the PR #48642 bug.
    spec = StepSpec(requests=(StepRequest(context_len=40, query_len=1), StepRequest(context_len=0, query_len=6)))
    case = materialize(spec, 1, "cpu")
    bad = run_case(case=case, entry=resolve("step", "step_full_req_id"))
    assert Kind.METADATA_MISMATCH in {f.kind for f in bad.findings}
    assert run_case(case=case, entry=resolve("step", "ours")).findings == ()


def test_the_fused_fast_check_skips_the_oracle_when_outputs_match_and_defers_to_it_when_not():
    from mlafuzz.tests.support.helpers import session_with

    case = materialize(dataclasses.replace(_gather(ValueMode.NAN), requests=REQS[:1]), 5, FAST_DEV)

    def boom(case):
        raise AssertionError("the oracle ran although the fast check said the outputs match")

    no_oracle = session_with("gather", oracle=boom)
    assert run_case(case=case, entry=no_oracle.entry("gather", "torch"), fast=True, in_session=no_oracle).findings == ()
    bad = run_case(case=case, entry=resolve("gather", "gather_nan_to_zero"), fast=True)
    assert Kind.NAN_MISMATCH in {f.kind for f in bad.findings}


def test_a_profiled_guarded_check_names_every_stage_bench_harness_prints():
    from torch.profiler import ProfilerActivity, profile

    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, "cpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert run_case(case=case, entry=resolve("gather", "torch")).findings == ()
    names = {ev.key for ev in prof.key_averages()}
    assert {f"mlafuzz::{s}" for s in ("run", "inputs", "rerun", "oracle", "guards")} <= names


def _counting_gather(tmp_path, *, spoil_first: bool):
    """A path-loaded gather that counts its calls; with spoil_first its first call leaves a
    wrong element (a bug that shows in one run only)."""
    path = tmp_path / f"counting_{int(spoil_first)}.py"
    path.write_text(
        "from mlafuzz.kernels.torch_impl import gather_torch\n"
        "CALLS = []\n"
        "def gather(src_cache, dst, *args):\n"
        "    gather_torch(src_cache, dst, *args)\n"
        "    CALLS.append(1)\n"
        f"    if {spoil_first} and len(CALLS) == 1:\n"
        "        dst.view(__import__('torch').int16)[0, 0] ^= 0x0100\n"
    )
    entry = resolve("gather", f"{path}:gather")
    fn = entry.load(FAST_DEV)
    return entry, fn, fn.__globals__["CALLS"]


def test_on_the_fast_path_a_clean_case_runs_the_kernel_once_and_twice_with_a_sampled_rerun(tmp_path):
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, FAST_DEV)
    entry, fn, calls = _counting_gather(tmp_path, spoil_first=False)
    assert run_case(case=case, entry=entry, fn=fn, fast=True).findings == ()
    assert len(calls) == 1
    assert run_case(case=case, entry=entry, fn=fn, rerun=True, fast=True).findings == ()
    assert len(calls) == 3


def test_a_wrong_result_in_one_run_only_is_nondeterminism_when_the_full_check_cannot_reproduce_it(tmp_path):
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, FAST_DEV)
    entry, fn, calls = _counting_gather(tmp_path, spoil_first=True)
    (finding,) = run_case(case=case, entry=entry, fn=fn, fast=True).findings
    assert finding.kind is Kind.NONDETERMINISM and finding.cause == "not_reproduced"
    assert "fused check" in finding.message and len(calls) == 3  # one fast run, then the full path's two


def test_a_mutated_input_is_input_mutation_and_the_case_is_rebuilt_for_the_full_check():
    """The fast path shares the case's own tensors and fingerprints them; a call that changes
    one sends the case, rebuilt from its spec and seed, to the full path."""
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, FAST_DEV)
    fresh = materialize(_gather(ValueMode.ACTIVATIONS), 3, FAST_DEV)
    found = run_case(case=case, entry=resolve("gather", "gather_mutates_cache"), fast=True).findings
    assert Kind.INPUT_MUTATION in {f.kind for f in found}, [f.message for f in found]
    assert all(torch.equal(case.tensors[k], v) for k, v in fresh.tensors.items() if v is not None)
    assert run_case(case=case, entry=resolve("gather", "torch"), fast=True).findings == ()


def test_on_the_fast_path_a_write_past_dst_moves_its_guard_zones_fingerprint_and_is_oob_write():
    """The fused check reads dst only; a write into the guard zones shows in their board slot
    (against the fill's fingerprint), and the full path names it."""
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, FAST_DEV)
    found = run_case(case=case, entry=resolve("gather", "gather_one_row_too_far"), fast=True).findings
    assert Kind.OOB_WRITE in {f.kind for f in found}, [f.message for f in found]
    assert Kind.NONDETERMINISM not in {f.kind for f in found}
    assert run_case(case=case, entry=resolve("gather", "torch"), fast=True, rerun=True).findings == ()


def test_a_mutated_input_of_a_case_that_cannot_be_rebuilt_is_still_input_mutation():
    case = materialize(_gather(ValueMode.ACTIVATIONS), 3, FAST_DEV)
    orphan = dataclasses.replace(case, seed=case.seed + 1)  # its spec and seed make other tensors
    (finding,) = run_case(case=orphan, entry=resolve("gather", "gather_mutates_cache"), fast=True).findings
    assert finding.kind is Kind.INPUT_MUTATION and "could not be rebuilt" in finding.message


def test_with_a_ulp_tolerance_an_output_within_it_draws_no_finding_on_either_path():
    """The fused checks are bit-exact; a tolerance leaves every case to the comparator (a fused
    "differs" the comparator then accepted was reported as nondeterminism)."""
    from mlafuzz.harness.check.compare import Policy
    from mlafuzz.kernels.torch_impl import gather_torch

    def one_ulp_off(src_cache, dst, *args):
        gather_torch(src_cache, dst, *args)
        bits = dst.view(torch.int16)
        bits[0, 0] = bits[0, 0] + 1

    entry = resolve("gather", "torch")
    for fast in (False, True):
        case = materialize(_gather(ValueMode.ACTIVATIONS), 3, FAST_DEV if fast else "cpu")
        assert run_case(case=case, entry=entry, fn=one_ulp_off, policy=Policy(ulp=1), fast=fast).findings == ()
        assert run_case(case=case, entry=entry, fn=one_ulp_off, fast=fast).findings != ()


_ROOM_DELETED = """
import sys, importlib.abc

class NoFastRoom(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "mlafuzz.harness.fast" or name.startswith("mlafuzz.harness.fast."):
            raise ImportError(f"{name} deleted for this test")
        return None

sys.meta_path.insert(0, NoFastRoom())
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.spec import Paging, ValueMode
from mlafuzz.harness.drive.run import fast_room
from mlafuzz.tests.support.helpers import materialize, resolve, run_case

assert fast_room() is None
reqs = (GatherRequest(context_len=70, seq_start=3, length=40), GatherRequest(context_len=20, length=20))
for mutant, values, kind in [("gather_one_row_too_far", "activations", "OOB_WRITE"),
                             ("gather_skip_last_row", "activations", "MISSING_WRITE"),
                             ("gather_mutates_cache", "activations", "INPUT_MUTATION"),
                             ("gather_nan_to_zero", "nan", "NAN_MISMATCH")]:
    case = materialize(GatherSpec(requests=reqs, paging=Paging(block_size=16), values=values), 3, "cpu")
    found = {f.kind.value for f in run_case(case=case, entry=resolve("gather", mutant), rerun=True, fast=True).findings}
    assert kind in found, (mutant, found)
    assert run_case(case=case, entry=resolve("gather", "torch"), rerun=True, fast=True).findings == ()
assert "mlafuzz.harness.fast" not in sys.modules
print("OK")
"""


def test_with_the_fast_room_deleted_every_detector_still_fires_and_only_speed_is_lost():
    """Deleting harness/fast (here: every import of it refused) leaves the runner on the full
    path, and the planted bugs still draw their kinds."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _ROOM_DELETED], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
