"""Our converts' SPEC section 7 options (BLOCK_STRIDE_ROWS, COMPACT_TO_FRONT) against the oracle.

Both our Triton convert (interpreted on CPU) and our torch convert. Compacted
rows are compared as the contract says, as multisets with a -1 tail
(``rows_as_sets_equal``), and valid_counts exactly.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import inspect  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.kernels.external import adapt_signature  # noqa: E402
from mlafuzz.kernels.torch_impl import convert_torch  # noqa: E402
from mlafuzz.oracles.convert import convert as oracle_convert  # noqa: E402
from mlafuzz.oracles.convert import rows_as_sets_equal  # noqa: E402
from mlafuzz.tests.support.convert_inputs import DEVICE, build_inputs, convert_cases  # noqa: E402
from mlafuzz.tests.support.helpers import HAS_TRITON  # noqa: E402
from mlafuzz.tests.support.offline import compile_offline  # noqa: E402

IMPLS = {"torch": convert_torch}
if HAS_TRITON:  # an optional extra: without it the triton cases skip and the torch ones still run
    from mlafuzz.kernels.triton_convert import convert as convert_triton

    IMPLS["triton"] = convert_triton
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
IMPL_NAMES = [pytest.param("triton", marks=needs_triton), "torch"]


def _oracle(c, req, bt, ti, ids, starts, stride, compact):
    return oracle_convert(
        req_id=req,
        block_table=bt,
        token_indices=ti,
        block_size=c["block_size"],
        has_prefill_workspace=ids is not None,
        prefill_workspace_request_ids=ids,
        prefill_workspace_starts=starts,
        block_stride_rows=stride,
        compact_to_front=compact,
    )


def _call(fn, c, req, bt, ti, ids, starts, stride, compact):
    extra = {} if stride is None else {"BLOCK_STRIDE_ROWS": stride}
    if compact:
        extra["COMPACT_TO_FRONT"] = True
    return fn(
        req,
        bt,
        ti,
        BLOCK_SIZE=c["block_size"],
        NUM_TOPK_TOKENS=c["k"],
        BLOCK_N=c["block_n"],
        HAS_PREFILL_WORKSPACE=c["prefill"],
        prefill_workspace_request_ids=ids,
        prefill_workspace_starts=starts,
        return_valid_counts=True,
        **extra,
    )


@pytest.mark.parametrize("impl", IMPL_NAMES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=convert_cases(), stride_extra=st.none() | st.integers(0, 70), compact=st.booleans())
def test_options_match_the_oracle_with_compacted_rows_as_multisets_and_exact_counts(impl, c, stride_extra, compact):
    req, bt, ti, ids, starts = build_inputs(c, DEVICE)
    stride = None if stride_extra is None else c["block_size"] + stride_extra
    out, counts = _call(IMPLS[impl], c, req, bt, ti, ids, starts, stride, compact)
    want_out, want_counts = _oracle(c, req, bt, ti, ids, starts, stride, compact)
    assert out.shape == want_out.shape and out.dtype == torch.int32 and out.is_contiguous()
    assert torch.equal(counts.cpu(), want_counts.cpu())
    if compact:
        assert bool(rows_as_sets_equal(expected=want_out.cpu(), actual=out.cpu(), counts=want_counts.cpu()).all())
    else:
        assert torch.equal(out.cpu(), want_out.cpu())


@pytest.mark.parametrize("impl", IMPL_NAMES)
def test_a_stride_multiplies_the_table_entry_and_wraps_in_int32_prefill_rows_ignore_it(impl):
    # Row 0 decodes through the table (blocks 2 and 2**20), row 1 is a prefill row at 1000.
    ti = torch.tensor([[5, 70, 200, -3] * 32] * 2, dtype=torch.int32, device=DEVICE)
    bt = torch.tensor([[2, 2**20, 4]], dtype=torch.int32, device=DEVICE)
    out, counts = IMPLS[impl](
        torch.zeros(2, dtype=torch.int32, device=DEVICE),
        bt,
        ti,
        BLOCK_SIZE=64,
        BLOCK_STRIDE_ROWS=4096,
        NUM_TOPK_TOKENS=128,
        BLOCK_N=128,
        HAS_PREFILL_WORKSPACE=True,
        prefill_workspace_request_ids=torch.tensor([-1, 0], dtype=torch.int32, device=DEVICE),
        prefill_workspace_starts=torch.tensor([1000], dtype=torch.int32, device=DEVICE),
        return_valid_counts=True,
    )
    wrapped = (2**20 * 4096 + 6 + 2**31) % 2**32 - 2**31  # 2**32 + 6 wraps to 6
    assert out[0, :4].tolist() == [2 * 4096 + 5, wrapped, -1, -1]
    assert out[1, :4].tolist() == [1005, 1070, -1, -1]  # no stride there; the table bound still holds
    assert counts.tolist() == [64, 64]


@pytest.mark.parametrize("impl", IMPL_NAMES)
def test_compaction_packs_valid_slots_at_the_front_across_tiles_and_pads_with_minus_one(impl):
    # Valid columns only in the second tile of 32, and a valid value of -1 (a wrapped slot) that
    # must stay in the prefix and count.
    ti = torch.full((1, 64), -1, dtype=torch.int32, device=DEVICE)
    ti[0, 40], ti[0, 63], ti[0, 50] = 3, 1, 2
    bt = torch.tensor([[2**31 - 1]], dtype=torch.int32, device=DEVICE)  # (2**31 - 1) * 2 + 1 wraps to -1
    out, counts = IMPLS[impl](
        torch.zeros(1, dtype=torch.int32, device=DEVICE),
        bt,
        ti,
        BLOCK_SIZE=4,
        BLOCK_STRIDE_ROWS=2,
        NUM_TOPK_TOKENS=64,
        BLOCK_N=32,
        return_valid_counts=True,
        COMPACT_TO_FRONT=True,
    )
    assert counts.tolist() == [3]
    assert sorted(out[0, :3].tolist()) == [-1, 0, 1] and (out[0, 3:] == -1).all()


def test_our_converts_declare_both_options_in_their_signatures():
    for fn in IMPLS.values():
        params = inspect.signature(fn).parameters
        assert params["COMPACT_TO_FRONT"].kind is inspect.Parameter.KEYWORD_ONLY
        assert list(params).index("BLOCK_STRIDE_ROWS") == 4  # vLLM's place, right after BLOCK_SIZE
        assert adapt_signature("convert", fn)[1] >= {"block_stride_rows", "compact_to_front"}


_PTX_SCRIPT = """
from mlafuzz.kernels.triton_convert import _convert_kernel
FLAGS = ("K", "TILE", "BS_POW2", "TI_COL_I64", "COMPACT")
names = [p.name for p in _convert_kernel.params]
sig = {n: "*i32" if n.endswith("_ptr") else "constexpr" if n in FLAGS else "i32" for n in names}
for pow2, compact in ((True, True), (False, True), (True, False), (False, False)):
    consts = dict(K=2048, TILE=2048, BS_POW2=pow2, TI_COL_I64=False, COMPACT=compact)
    try:
        triton.compile(ASTSource(fn=_convert_kernel, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    except ImportError as exc:
        print("SKIP", exc)
        sys.exit(0)
print("OK")
"""


@pytest.mark.slow
@needs_triton
def test_the_gpu_build_of_both_options_compiles_offline_for_sm90():

    compile_offline(_PTX_SCRIPT)
