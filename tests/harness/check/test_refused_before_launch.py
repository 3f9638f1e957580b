"""A class that could corrupt memory must be refused before any kernel is launched (SPEC 3): an
exception out of the launch itself is no refusal. vLLM's DCP filter, given a req_id longer than
token_indices under Triton's interpreter, wrote past its own ``out`` and then raised out of the
interpreter; read as a refusal, its worker went on with a damaged heap and died on the next valid
case (a CRASH whose bundle replays clean)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from mlafuzz.reports.findings import Kind  # noqa: E402
from mlafuzz.tests.support.helpers import (  # noqa: E402
    HAS_TRITON,
    INVALID_CLASSES,
    check_contract,
    draw_spec,
    materialize,
    resolve,
)

if HAS_TRITON:  # an optional extra: without it these skip
    import triton
    import triton.language as tl

    @triton.jit
    def _refuses_in_the_kernel(scratch_ptr, ROWS: tl.constexpr):
        tl.store(scratch_ptr, ROWS)  # it ran before it looked (into a buffer of its own: no guard sees it)
        tl.static_assert(ROWS == 0, "too many rows")


pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")

CLASSES = {k.name: k for k in INVALID_CLASSES["convert"]}


def _launches_then_raises(req_id, block_table, token_indices, **kwargs):
    _refuses_in_the_kernel[(1,)](torch.empty(1, dtype=torch.int32), ROWS=req_id.shape[0])


def _refuses_on_the_host(req_id, block_table, token_indices, **kwargs):
    if req_id.shape[0] != token_indices.shape[0]:
        raise ValueError("req_id and token_indices differ in length")


def _wraps_the_launchs_error(*args, **kwargs):
    try:
        _launches_then_raises(*args, **kwargs)
    except Exception as exc:
        raise ValueError("bad input") from exc  # its own message; the launch ran all the same


def _found(fn, klass: str):
    case = materialize(draw_spec("convert", seed=3), 3)
    return check_contract(case=case, entry=resolve("convert", "torch"), fn=fn, klass=CLASSES[klass])


@pytest.mark.parametrize("fn", [_launches_then_raises, _wraps_the_launchs_error], ids=["raised", "wrapped"])
def test_a_memory_unsafe_input_that_raised_out_of_the_launch_is_accepted_not_refused(fn):
    (finding,) = _found(fn, "length_mismatch")
    assert finding.kind is Kind.ACCEPTED_INVALID_INPUT and finding.cause == "contract:length_mismatch"
    assert finding.extra["invalid_class"] == "length_mismatch"
    assert "out of its kernel's launch (triton/runtime/" in finding.message


def test_a_memory_unsafe_input_refused_on_the_host_is_a_refusal():
    assert _found(_refuses_on_the_host, "length_mismatch") == []


def test_a_memory_safe_input_that_raised_out_of_the_launch_is_still_a_refusal():
    # Nothing is at stake in memory, and a kernel that refuses a dtype by failing to compile refuses it.
    assert _found(_launches_then_raises, "wrong_dtype") == []
