"""The fused convert check agrees with the oracle: yes on the oracle's outputs, no on any changed slot or count."""

from __future__ import annotations

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
    return matches(convert_rows_flag(req_id=t["req_id"], block_table=t["block_table"], token_indices=t["token_indices"],
                              block_size=p["BLOCK_SIZE"], has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
                              prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
                              prefill_workspace_starts=t["prefill_workspace_starts"], out=out, valid_counts=counts))


@given(spec=specs("convert"), seed=st.integers(0, 2**32 - 1), where=st.integers(0, 2**31), delta=st.integers(1, 9))
@settings(max_examples=30, deadline=None)
def test_yes_on_the_oracles_outputs_and_no_after_any_single_change(spec, seed, where, delta):
    case = materialize(spec, seed, DEV)
    t, p = case.tensors, case.params
    out, counts = oc.convert(req_id=t["req_id"], block_table=t["block_table"], token_indices=t["token_indices"],
                             block_size=p["BLOCK_SIZE"], has_prefill_workspace=p["HAS_PREFILL_WORKSPACE"],
                             prefill_workspace_request_ids=t["prefill_workspace_request_ids"],
                             prefill_workspace_starts=t["prefill_workspace_starts"])
    assert _check(case, out, counts) and _check(case, out, None)
    if out.numel():
        bad = out.clone()
        bad.view(-1)[where % out.numel()] += delta
        assert not _check(case, bad, counts)
        bad_counts = counts.clone()
        bad_counts[where % counts.numel()] += delta
        assert not _check(case, out, bad_counts)
