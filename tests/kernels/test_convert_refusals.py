"""Drop-in refusals: where vLLM's convert asserts, ours raises an AssertionError too.

vLLM's tests and callers are written as ``pytest.raises(AssertionError)`` or
``except AssertionError``; they must catch our refusals of the same inputs,
which still carry the harness's ``reason`` vocabulary.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from mlafuzz.kernels.checks import CONVERT_REJECTS, InvalidInputError  # noqa: E402
from mlafuzz.kernels.torch_impl import convert_torch  # noqa: E402
from mlafuzz.tests.support.helpers import HAS_TRITON  # noqa: E402

IMPLS = {"torch": convert_torch}
if HAS_TRITON:  # an optional extra: without it the triton cases skip and the torch ones still run
    from mlafuzz.kernels.triton_convert import convert as convert_triton

    IMPLS["triton"] = convert_triton
IMPL_NAMES = [pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton")), "torch"]
I32 = torch.int32


def _args(**changes):
    args = dict(
        req_id=torch.zeros(2, dtype=I32),
        block_table=torch.zeros((1, 1), dtype=I32),
        token_indices=torch.zeros((2, 64), dtype=I32),
        BLOCK_SIZE=64,
        NUM_TOPK_TOKENS=64,
        BLOCK_N=32,
    )
    args.update(changes)
    return args


# What vLLM's convert asserts, in its order: the three dtypes, the row counts, K, K % BLOCK_N, the
# prefill arrays present and int32.
ASSERTED = {
    "req_id_int64": ("wrong_dtype", dict(req_id=torch.zeros(2, dtype=torch.int64))),
    "block_table_int64": ("wrong_dtype", dict(block_table=torch.zeros((1, 1), dtype=torch.int64))),
    "token_indices_int64": ("wrong_dtype", dict(token_indices=torch.zeros((2, 64), dtype=torch.int64))),
    "req_id_longer": ("length_mismatch", dict(req_id=torch.zeros(3, dtype=I32))),
    "k_not_num_topk": ("k_mismatch", dict(NUM_TOPK_TOKENS=128)),
    "k_not_multiple": ("k_not_multiple_of_block_n", dict(BLOCK_N=128, NUM_TOPK_TOKENS=64)),
    "prefill_ids_missing": (
        "missing_prefill_args",
        dict(HAS_PREFILL_WORKSPACE=True, prefill_workspace_starts=torch.zeros(1, dtype=I32)),
    ),
    "prefill_starts_int64": (
        "wrong_dtype",
        dict(
            HAS_PREFILL_WORKSPACE=True,
            prefill_workspace_request_ids=torch.zeros(2, dtype=I32),
            prefill_workspace_starts=torch.zeros(1, dtype=torch.int64),
        ),
    ),
}


@pytest.mark.parametrize("impl", IMPL_NAMES)
@pytest.mark.parametrize("case", sorted(ASSERTED))
def test_a_vllm_style_raises_assertion_error_catches_our_refusal(impl, case):
    reason, changes = ASSERTED[case]
    assert reason in CONVERT_REJECTS
    with pytest.raises(AssertionError) as info:
        IMPLS[impl](**_args(**changes))
    # Still ours: the harness's vocabulary, and the ValueError (TypeError for dtypes) it always was.
    assert isinstance(info.value, InvalidInputError) and info.value.reason == reason
    assert isinstance(info.value, TypeError if reason == "wrong_dtype" else ValueError)


@pytest.mark.parametrize("impl", IMPL_NAMES)
@pytest.mark.parametrize(
    "reason,changes",
    [
        ("bad_block_size", dict(BLOCK_SIZE=0)),
        ("bad_block_n", dict(BLOCK_N=24, NUM_TOPK_TOKENS=48, token_indices=torch.zeros((2, 48), dtype=I32))),
        ("bad_block_stride", dict(BLOCK_STRIDE_ROWS=0)),
    ],
)
def test_refusals_vllm_does_not_assert_stay_plain_value_errors(impl, reason, changes):
    with pytest.raises(InvalidInputError) as info:
        IMPLS[impl](**_args(**changes))
    assert info.value.reason == reason and not isinstance(info.value, AssertionError)
