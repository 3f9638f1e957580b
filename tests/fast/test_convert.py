"""The fused convert check agrees with the oracle: yes on the oracle's outputs, no on any changed slot or count."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.harness.fast.convert import convert_rows_flag  # noqa: E402
from mlafuzz.harness.ops.convert import compacts, oracle_inputs  # noqa: E402
from mlafuzz.oracles import convert as oc  # noqa: E402
from mlafuzz.tests.support.helpers import (  # noqa: E402
    matches,
    materialize,
    specs,  # noqa: E402
)
from mlafuzz.tests.support.offline import compile_offline

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _check(case, out, counts, *, second=None, same=False) -> bool:
    # The case's inputs as the op row hands them (SPEC 10's idx_mapping and DCP arguments included),
    # its rows compacted where the case's revision or COMPACT_TO_FRONT says so.
    return matches(
        convert_rows_flag(
            **oracle_inputs(case), out=out, valid_counts=counts, compact=compacts(case), second=second, same=same
        )
    )


def _oracle(case):
    return oc.convert(**oracle_inputs(case), compact_to_front=compacts(case))


def _shuffled_prefixes(out, counts, seed: int):
    """The same compacted rows with each valid prefix in another order (any order is right)."""
    g = torch.Generator().manual_seed(seed)
    rows = out.clone()
    for i, n in enumerate(counts.tolist()):
        if n > 1:
            rows[i, :n] = rows[i, :n][torch.randperm(n, generator=g).to(rows.device)]
    return rows


@given(spec=specs("convert"), seed=st.integers(0, 2**32 - 1), where=st.integers(0, 2**31), delta=st.integers(1, 9))
@settings(max_examples=30, deadline=None)
def test_yes_on_the_oracles_outputs_and_no_after_any_single_change(spec, seed, where, delta):
    case = materialize(spec, seed, DEV)
    # Every drawn option is judged here: a block stride, and compaction (rows as multisets).
    out, counts = _oracle(case)
    assert _check(case, out, counts) and _check(case, out, None)
    if compacts(case):
        assert _check(case, _shuffled_prefixes(out, counts, seed), counts)
    if out.numel():
        bad = out.clone()
        bad.view(-1)[where % out.numel()] += delta
        assert not _check(case, bad, counts)
        bad_counts = counts.clone()
        bad_counts[where % counts.numel()] += delta
        assert not _check(case, out, bad_counts)


@given(spec=specs("convert"), seed=st.integers(0, 2**32 - 1), where=st.integers(0, 2**31), delta=st.integers(1, 9))
@settings(max_examples=20, deadline=None)
def test_a_rerun_judged_in_the_same_launch_passes_only_where_both_runs_are_the_oracles(spec, seed, where, delta):
    """A re-run's outputs are checked beside the first run's (one launch): any single change in
    either run is seen; a compacted re-run in another order passes (each run a multiset, as the
    full path's re-run compares rows) unless it must be the first run's bits (a caller's buffer)."""
    case = materialize(spec, seed, DEV)
    out, counts = _oracle(case)
    assert _check(case, out, counts, second=(out.clone(), counts.clone()), same=True)
    assert _check(case, out, None, second=(out.clone(), None))
    if compacts(case):
        shuffled = _shuffled_prefixes(out, counts, seed)
        assert _check(case, out, counts, second=(shuffled, counts))
        assert _check(case, out, counts, second=(shuffled, counts), same=True) == torch.equal(shuffled, out)
    if out.numel():
        bad = out.clone()
        bad.view(-1)[where % out.numel()] += delta
        assert not _check(case, out, counts, second=(bad, counts))
        assert not _check(case, bad, counts, second=(out, counts))
        bad_counts = counts.clone()
        bad_counts[where % counts.numel()] += delta
        assert not _check(case, out, counts, second=(out, bad_counts))
    elif counts.numel():
        assert not _check(case, out, counts, second=(out, counts + 1))


def test_a_stride_is_judged_and_a_compacted_row_is_a_multiset_with_a_minus_one_tail():
    from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
    from mlafuzz.generators.spec import Paging, TopkMode

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

    many_rows = (ConvertRequest(seq_len=200, num_tokens=16),)
    compact = materialize(
        dataclasses.replace(spec, requests=many_rows, compact=True, topk_mode=TopkMode.PADDED), 5, DEV
    )
    out, counts = _oracle(compact)
    assert _check(compact, out, counts) and _check(compact, _shuffled_prefixes(out, counts, 1), counts)
    i = int(((counts > 1) & (counts < 64)).nonzero()[0])
    n = int(counts[i])
    swapped = out.clone()  # a prefix value swapped with the tail's first -1: same multiset, wrong shape
    swapped[i, n - 1], swapped[i, n] = out[i, n], out[i, n - 1]
    doubled = out.clone()  # one slot twice, another missing: the count and the tail still right
    doubled[i, 1] = out[i, 0]
    assert not _check(compact, swapped, counts) and not _check(compact, doubled, counts)
    assert not _check(compact, out, counts + 1)


_PTX_SCRIPT = """
from mlafuzz.harness.fast.convert_rows import _KEYS, _SMALL_TILE, _TILE, _check_convert
sig = {p.name: "*i32" if p.name.endswith("_ptr") else "constexpr" if p.is_constexpr else "i32"
       for p in _check_convert.params}
for tile in (_SMALL_TILE, _TILE):
    consts = dict(TILE=tile, KEY1=_KEYS[0], KEY2=_KEYS[1])
    try:
        triton.compile(ASTSource(fn=_check_convert, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    except ImportError as exc:
        print("SKIP", exc)
        sys.exit(0)
print("OK")
"""


@pytest.mark.slow
def test_the_gpu_build_of_the_fused_check_compiles_offline_for_sm90_in_both_tiles():
    # K, compaction, prefill rows, the prefill mode, DCP and counts are runtime: two builds serve
    # every case of a run.
    compile_offline(_PTX_SCRIPT)
