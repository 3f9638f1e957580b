"""The fused convert check agrees with the oracle: yes on the oracle's outputs, no on any changed slot or count."""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.harness.fast.convert import convert_rows_flag  # noqa: E402
from mlafuzz.oracles import convert as oc  # noqa: E402
from mlafuzz.tests.support.helpers import (  # noqa: E402
    matches,
    materialize,
    specs,  # noqa: E402
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _check(case, out, counts) -> bool:
    t, p = case.tensors, case.params
    return matches(
        convert_rows_flag(
            req_id=t["req_id"],
            block_table=t["block_table"],
            token_indices=t["token_indices"],
            block_size=p["BLOCK_SIZE"],
            has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
            prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
            prefill_workspace_starts=t["prefill_workspace_starts"],
            out=out,
            valid_counts=counts,
            block_stride_rows=p.get("BLOCK_STRIDE_ROWS"),
        )
    )


@given(spec=specs("convert"), seed=st.integers(0, 2**32 - 1), where=st.integers(0, 2**31), delta=st.integers(1, 9))
@settings(max_examples=30, deadline=None)
def test_yes_on_the_oracles_outputs_and_no_after_any_single_change(spec, seed, where, delta):
    case = materialize(spec, seed, DEV)
    t, p = case.tensors, case.params
    # The drawn block stride is judged here; compaction is not (the full path's, see accepts()).
    out, counts = oc.convert(
        req_id=t["req_id"],
        block_table=t["block_table"],
        token_indices=t["token_indices"],
        block_size=p["BLOCK_SIZE"],
        has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
        prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
        prefill_workspace_starts=t["prefill_workspace_starts"],
        block_stride_rows=p.get("BLOCK_STRIDE_ROWS"),
    )
    assert _check(case, out, counts) and _check(case, out, None)
    if out.numel():
        bad = out.clone()
        bad.view(-1)[where % out.numel()] += delta
        assert not _check(case, bad, counts)
        bad_counts = counts.clone()
        bad_counts[where % counts.numel()] += delta
        assert not _check(case, out, bad_counts)


def test_a_stride_is_judged_and_compacted_cases_are_left_to_the_full_path():
    from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
    from mlafuzz.generators.spec import Paging
    from mlafuzz.harness.fast.convert import accepts

    spec = ConvertSpec(
        requests=(ConvertRequest(seq_len=200, num_tokens=3),),
        paging=Paging(block_size=16),
        topk=64,
        block_n=32,
        block_stride_rows=40,
    )
    case = materialize(spec, 5, DEV)
    t = case.tensors
    strided, counts = oc.convert(
        req_id=t["req_id"],
        block_table=t["block_table"],
        token_indices=t["token_indices"],
        block_size=16,
        block_stride_rows=40,
    )
    plain, _ = oc.convert(
        req_id=t["req_id"], block_table=t["block_table"], token_indices=t["token_indices"], block_size=16
    )
    assert not torch.equal(strided, plain)
    assert _check(case, strided, counts) and not _check(case, plain, counts)
    assert accepts(case)
    compact = materialize(dataclasses.replace(spec, compact=True), 5, DEV)
    assert not accepts(compact)
