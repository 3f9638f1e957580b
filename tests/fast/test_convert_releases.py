"""The fast path judges the convert as vLLM's releases run it (SPEC 10): a counted row compacted
under the newest revision (2026-11), ``idx_mapping`` and the DCP arguments computed by the fused
kernel. Ours come out Clear; an in-place convert under 2026-11 and each release mutant do not, and
the full path then names the mutant's kind. Under Triton's CPU interpreter on small drawn cases."""

from __future__ import annotations

import functools
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from mlafuzz.generators.draw import SMALL  # noqa: E402
from mlafuzz.harness.fast.path import Clear  # noqa: E402
from mlafuzz.harness.ops.convert import compacts  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels.torch_impl import convert_torch  # noqa: E402
from mlafuzz.tests.support.helpers import fast_path_hides_nothing, fast_verdict, resolve  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CONVERT = OPS.get("convert")


def _cases(capabilities: frozenset[str], count: int, keep) -> list:
    """The first ``count`` drawn cases (as fit for ``capabilities``) that ``keep`` accepts."""
    found = []
    for seed in range(600):
        case = OPS.materialize(CONVERT.fit(OPS.draw_spec("convert", seed=seed, knobs=SMALL), capabilities), seed, DEV)
        if keep(case):
            found.append(case)
            if len(found) == count:
                return found
    raise AssertionError("too few such cases drawn")


def _releases(case) -> bool:
    return case.tensors.get("idx_mapping") is not None or "dcp_size" in case.params


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_ours_are_clear_on_compacted_counted_rows_and_the_releases_arguments(impl):
    cases = _cases(resolve("convert", impl).capabilities, 6, lambda c: compacts(c) and _releases(c))
    for i, case in enumerate(cases):
        assert isinstance(fast_verdict(case, impl, rerun=i % 2 == 0), Clear), case.case_id


def test_an_in_place_convert_judged_under_the_compact_rule_is_not_clear():
    in_place = functools.partial(convert_torch, revision="2026-10")  # vLLM up to 0.29
    entry = resolve("convert", "torch")

    def shows(case) -> bool:  # a counted row with an invalid column before a valid one
        out = convert_torch(**_call(case), revision="2026-10")[0]
        return compacts(case) and bool(((out[:, :-1] == -1) & (out[:, 1:] != -1)).any())

    for case in _cases(entry.capabilities - {"compact_to_front", "idx_mapping", "dcp_args"}, 4, shows):
        assert not isinstance(fast_verdict(case, "torch", fn=in_place), Clear), case.case_id


def _call(case) -> dict:
    t, p = case.tensors, case.params
    return dict(
        req_id=t["req_id"],
        block_table=t["block_table"],
        token_indices=t["token_indices"],
        BLOCK_SIZE=p["BLOCK_SIZE"],
        NUM_TOPK_TOKENS=p["NUM_TOPK_TOKENS"],
        BLOCK_N=p["BLOCK_N"],
        HAS_PREFILL_WORKSPACE=p["HAS_PREFILL_WORKSPACE"],
        prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
        prefill_workspace_starts=t["prefill_workspace_starts"],
        return_valid_counts=True,
        BLOCK_STRIDE_ROWS=p.get("BLOCK_STRIDE_ROWS"),
    )


@pytest.mark.parametrize(
    "mutant", ["convert_compact_hole", "convert_idx_mapping_ignored", "convert_rank_stride_ignored"]
)
def test_each_release_mutant_is_never_clear_where_the_full_path_finds_it(mutant):
    entry = resolve("convert", mutant)
    assert fast_path_hides_nothing(entry, _cases(entry.capabilities, 40, lambda c: True), enough=2), mutant


def test_the_fused_check_judges_a_width_that_is_not_a_multiple_of_its_tile():
    # K = 3 * BLOCK_N = 48: its tile (next_pow2(48) = 64) runs past K; the last tile is masked.
    from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
    from mlafuzz.generators.spec import Paging
    from mlafuzz.harness.fast.convert import convert_rows_flag
    from mlafuzz.harness.ops.convert import oracle_inputs
    from mlafuzz.oracles import convert as oc

    spec = ConvertSpec(
        requests=(ConvertRequest(seq_len=200, num_tokens=5),), paging=Paging(block_size=16), topk=48, block_n=16
    )
    case = OPS.materialize(spec, 3, DEV)
    out, counts = oc.convert(**oracle_inputs(case), compact_to_front=compacts(case))

    def flag(o, c):
        f = convert_rows_flag(**oracle_inputs(case), out=o, valid_counts=c, compact=compacts(case))
        assert f is not None  # it can tell
        return bool(f.reshape(-1)[0])

    assert not flag(out, counts)
    wrong = out.clone()
    wrong[0, 47] = 12345  # the last column of the masked tile
    assert flag(wrong, counts) and flag(out, counts + 1)
