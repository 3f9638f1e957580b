"""vLLM's DCP filter as released (SPEC 10): D = 1 handed to the plain convert, and the filter's
BLOCK_STRIDE_ROWS (0.29.0), through our implementations, the oracle and the planted look-alikes."""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")  # our Triton DCP filter is among the implementations checked

from mlafuzz.generators.draw import SMALL  # noqa: E402
from mlafuzz.harness.check.session import Session  # noqa: E402
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz  # noqa: E402
from mlafuzz.harness.drive.workers import InProcess  # noqa: E402
from mlafuzz.harness.ops import dcp as dcp_row  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels import torch_impl, triton_convert  # noqa: E402
from mlafuzz.kernels.external import adapt_signature  # noqa: E402
from mlafuzz.kernels.registry import Registry, default_registry  # noqa: E402
from mlafuzz.oracles import revisions  # noqa: E402

COMPACT = "2026-compact"  # a revision whose plain convert packs counted rows (vLLM 0.30.0 on)
I32 = torch.int32


def _add_compact_revision(monkeypatch) -> None:
    table = revisions.TABLE.with_revision(
        name=COMPACT, change="test: vLLM 0.30.0's counted convert", source="tests", rules={"convert_counted": "compact"}
    )
    monkeypatch.setattr(revisions, "TABLE", table)


def _t(rows):
    return torch.tensor(rows, dtype=I32)


@pytest.mark.parametrize("fn", [torch_impl.filter_and_convert_dcp_torch, triton_convert.filter_and_convert_dcp])
def test_at_d1_our_filters_leave_an_uncounted_row_in_place_and_pack_a_counted_one_as_the_revision_says(fn, monkeypatch):
    _add_compact_revision(monkeypatch)
    # bs=2, table [4, 6]: token 3 -> block 1 offset 1 = 13; token 0 -> 8; -1 and 9 (past the table) invalid.
    args = (_t([0]), _t([[4, 6]]), _t([[-1, 3, 9, 0]]), 1, 0)
    kw = dict(BLOCK_SIZE=2, NUM_TOPK_TOKENS=4, BLOCK_N=4, compact_valid_to_front=True)
    assert fn(*args, **kw).tolist() == [[-1, 13, -1, 8]]  # uncounted: in place under every revision
    out, counts = fn(*args, **kw, return_valid_counts=True, revision="2026-10")
    assert out.tolist() == [[-1, 13, -1, 8]] and counts.tolist() == [2]  # in_place revision
    out, counts = fn(*args, **kw, return_valid_counts=True, revision=COMPACT)
    assert sorted(out[0, :2].tolist()) == [8, 13] and out[0, 2:].tolist() == [-1, -1] and counts.tolist() == [2]
    # D = 2 keeps the caller's flag: packed though uncounted (rank 1: tokens 1, 3 are its local 0, 1).
    assert fn(_t([0]), _t([[4, 6]]), _t([[-1, 1, 3, 0]]), 2, 1, **kw).tolist() == [[8, 9, -1, -1]]


def test_the_oracle_judges_a_d1_case_by_the_cases_revision(monkeypatch):
    _add_compact_revision(monkeypatch)
    seen = set()
    for seed in range(200):
        spec = OPS.draw_spec("dcp", seed=seed, knobs=SMALL)
        if spec.dcp_size != 1 or not spec.batch.return_valid_counts:
            continue
        case = OPS.materialize(spec, seed, "cpu")
        for revision, packed in (("2026-10", False), (COMPACT, True)):
            case = dataclasses.replace(case, params={**case.params, "revision": revision})
            assert dcp_row.compacts(case) is packed
            out, _ = dcp_row.filter_slots(case, loop=False)
            assert torch.equal(out, dcp_row.filter_slots(case, loop=False, compact=packed)[0])
        seen.add(spec.compact)
    assert seen == {True, False}  # D = 1 counted cases drawn with and without compact_valid_to_front


def test_d1_cases_and_padded_filter_strides_are_drawn_within_a_few_dozen_small_cases():
    specs = [OPS.draw_spec("dcp", seed=s, knobs=SMALL) for s in range(60)]
    assert sum(s.dcp_size == 1 for s in specs) >= 8
    assert any(
        s.batch.block_stride_rows is not None and s.batch.block_stride_rows > s.batch.paging.block_size for s in specs
    )


@pytest.mark.parametrize("impl, cases", [("torch", 60), ("triton", 24)])
def test_our_filters_stay_clean_under_a_compacting_revision_at_every_d(tmp_path, monkeypatch, impl, cases):
    _add_compact_revision(monkeypatch)
    config = FuzzConfig(
        ops=("dcp",), impls={"dcp": impl}, device="cpu", cases=cases, seed=5, out_dir=tmp_path, revision=COMPACT
    )
    # Our entries follow the revisions of the table they were built with: rebuilt with this one's.
    entries = [
        dataclasses.replace(e, revisions=frozenset(revisions.names())) if e.op == "dcp" and not e.is_mutant else e
        for e in default_registry().entries()
    ]
    session = Session(table=OPS, registry=Registry.of(entries))
    summary = fuzz(config, executor=InProcess(session=session))
    assert summary.cases == cases and summary.skipped == 0 and summary.findings == 0, summary.by_kind
    assert summary.coverage["dcp:D1"] and summary.coverage["stride:padded"]


def test_a_filter_that_names_block_stride_rows_has_the_capability_and_one_that_does_not_lacks_it():
    assert adapt_signature("dcp", torch_impl.filter_and_convert_dcp_torch)[1] == {"block_stride_rows"}

    def older(req_id, block_table, token_indices, dcp_size, dcp_rank, cp_kv_cache_interleave_size=1, **kw):
        return None

    assert adapt_signature("dcp", older)[1] == frozenset()


@pytest.mark.parametrize("mutant", ["dcp_handoff_compacts", "dcp_local_width_table"])
def test_each_new_dcp_look_alike_is_killed_with_its_kind_on_the_cpu(tmp_path, mutant):
    config = FuzzConfig(ops=("dcp",), impls={"dcp": mutant}, device="cpu", cases=40, seed=0, out_dir=tmp_path)
    summary = fuzz(config, executor=InProcess(session=Session(table=OPS)))
    assert set(summary.by_kind) == {"VALUE_MISMATCH"}, summary.by_kind


def test_a_d1_counted_row_packed_under_an_in_place_revision_names_the_revision_it_matches(monkeypatch):
    from mlafuzz.tests.support.helpers import run_case

    _add_compact_revision(monkeypatch)
    ours = default_registry().get("dcp", "torch")
    packing = dataclasses.replace(
        ours,
        name="packs",
        revisions=None,
        loader=lambda device: functools.partial(ours.loader(device), revision=COMPACT),
    )
    hinted = 0
    for seed in range(80):
        spec = OPS.draw_spec("dcp", seed=seed, knobs=SMALL)
        if spec.dcp_size != 1 or not spec.batch.return_valid_counts:
            continue
        case = OPS.materialize(spec, seed, "cpu")
        case = dataclasses.replace(case, params={**case.params, "revision": "2026-10"})
        for f in run_case(case=case, entry=packing, fast=False).findings:
            assert f.kind.value == "VALUE_MISMATCH" and f.tensor == "out", f
            assert f.extra.get("matches_revision") == COMPACT and f"--revision {COMPACT}" in f.message
            hinted += 1
    assert hinted >= 2
