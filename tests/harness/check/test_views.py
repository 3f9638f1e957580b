"""The harness on SPEC 8's inputs: call-site views and caches at the top of a huge one.

Planted kernels that assume contiguous inputs, or compute record offsets in 32 bits, are found on
the cases the generators now draw, and the torch implementations are clean on the same cases; a
dst that is a row slice of a workspace is guarded as one; an in-place cache with zero blocks is
compared past them, its zero blocks checked, indices reported in the full cache; bundles of such
cases hold only the blocks the case made, and replay."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.ops.writer import WriterSpec
from mlafuzz.generators.spec import Paging, View, spec_to_json
from mlafuzz.harness.cli.main import main
from mlafuzz.reports.findings import Kind
from mlafuzz.tests.support.helpers import materialize, resolve, run_case

PLANTED = Path(__file__).parents[2] / "support" / "planted"
HIGH_31 = (1 << 31) // (16 * 656) + 1  # block size 16: every record past 2**31 bytes

GATHER = GatherSpec(
    requests=(
        GatherRequest(context_len=300, seq_start=40, length=200),
        GatherRequest(context_len=50, seq_start=3, length=40),
    ),
    paging=Paging(block_size=16, layout="shuffled"),
)
CONVERT = ConvertSpec(
    requests=(ConvertRequest(seq_len=500, num_tokens=4), ConvertRequest(seq_len=90, num_tokens=3)),
    paging=Paging(block_size=16, layout="shuffled"),
    topk=64,
    block_n=32,
    topk_mode="valid",
)
WRITER = WriterSpec(num_tokens=40, paging=Paging(block_size=16, spare_blocks=1))


def _kinds(case, ref: str, op: str, *, rerun: bool = True) -> set[Kind]:
    return {f.kind for f in run_case(case=case, entry=resolve(op, ref), rerun=rerun, fast=False).findings}


def _planted(module: str, fn: str) -> str:
    return f"{PLANTED / module}:{fn}"


@pytest.mark.parametrize(
    "spec, op, planted",
    [
        (dataclasses.replace(GATHER, table_view=View.COLUMNS), "gather", "gather_contiguous_table"),
        (dataclasses.replace(CONVERT, table_view=View.COLUMNS), "convert", "convert_contiguous_table"),
        (dataclasses.replace(CONVERT, rows_view=View.ROWS), "convert", "convert_indices_from_row_0"),
        (dataclasses.replace(WRITER, inputs_view=View.COLUMNS), "writer", "writer_contiguous_inputs"),
    ],
    ids=["gather-table-columns", "convert-table-columns", "convert-indices-rows", "writer-split-inputs"],
)
def test_a_kernel_assuming_contiguous_inputs_is_found_on_the_view_and_not_without_it(spec, op, planted):
    ref = _planted("contiguity.py", planted)
    case = materialize(spec, 3)
    assert Kind.VALUE_MISMATCH in _kinds(case, ref, op)
    assert _kinds(case, "torch", op) == set()
    views = [f for f in ("table_view", "rows_view", "inputs_view") if getattr(spec, f, View.PLAIN) is not View.PLAIN]
    plain = materialize(dataclasses.replace(spec, **{f: View.PLAIN for f in views}), 3)
    assert _kinds(plain, ref, op) == set()  # why the views must be drawn: plain tensors hide the bug


@pytest.mark.parametrize(
    "spec, op, planted",
    [
        (
            dataclasses.replace(GATHER, paging=dataclasses.replace(GATHER.paging, base_block=HIGH_31)),
            "gather",
            "gather_int32_offsets",
        ),
        (
            dataclasses.replace(WRITER, paging=dataclasses.replace(WRITER.paging, base_block=HIGH_31)),
            "writer",
            "writer_int32_offsets",
        ),
    ],
    ids=["gather", "writer"],
)
def test_record_offsets_in_int32_are_found_on_a_cache_past_2_31_bytes(spec, op, planted):
    ref = _planted("offsets.py", planted)
    case = materialize(spec, 1)
    cache = case.tensors["src_cache" if op == "gather" else "kv_cache"]
    assert cache.numel() > 1 << 31  # a CPU case maps it: reading its zero blocks is the cost, one run each
    assert Kind.VALUE_MISMATCH in _kinds(case, ref, op, rerun=False)
    assert _kinds(case, "torch", op, rerun=False) == set()
    low = materialize(dataclasses.replace(spec, paging=dataclasses.replace(spec.paging, base_block=0)), 1)
    assert _kinds(low, ref, op) == set()  # a small cache hides it


def test_a_dst_row_slice_is_guarded_with_its_workspace():
    spec = dataclasses.replace(GATHER, dst_view=View.ROWS)
    for seed in range(6):  # workspace layouts the spec draws
        case = materialize(spec, seed)
        assert case.params["dst_rows_before"] > 0
        assert Kind.OOB_WRITE in _kinds(case, "gather_one_row_too_far", "gather")
        assert Kind.MISSING_WRITE in _kinds(case, "gather_skip_last_row", "gather")
        assert _kinds(case, "torch", "gather") == set()
    case = materialize(spec, 0)
    before = resolve("gather", _planted("contiguity.py", "gather_one_row_before"))
    (finding,) = [f for f in run_case(case=case, entry=before, fast=False).findings if f.kind is Kind.OOB_WRITE]
    assert finding.cause == "dst:oob_before" and "bytes before it" in finding.message


def test_a_writer_cache_high_in_a_larger_one_is_compared_past_its_zero_blocks():
    base = 5000
    spec = dataclasses.replace(WRITER, paging=dataclasses.replace(WRITER.paging, base_block=base))
    case = materialize(spec, 2)
    assert _kinds(case, "torch", "writer") == set()
    low = _planted("contiguity.py", "writer_ignores_base")
    (head,) = [
        f
        for f in run_case(case=case, entry=resolve("writer", low), fast=False).findings
        if f.cause == "kv_cache:zero_blocks"
    ]
    assert head.kind is Kind.VALUE_MISMATCH and head.mismatches[0].index[0] < base
    assert "which no slot maps to" in head.message
    (tail,) = [
        f
        for f in run_case(case=case, entry=resolve("writer", "writer_scale_pow2"), fast=False).findings
        if f.kind is Kind.VALUE_MISMATCH
    ]
    assert tail.mismatches and all(m.index[0] >= base for m in tail.mismatches)


def test_a_high_cache_bundle_stores_the_cases_blocks_and_replays(tmp_path, capsys):
    high = 40_000  # block ids past 2**15 (bs 1: a 26 MB cache, cheap to map), which the planted bug truncates
    spec = dataclasses.replace(GATHER, requests=GATHER.requests[:1], paging=Paging(block_size=1, base_block=high))
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec_to_json(spec))
    out = tmp_path / "run"
    rc = main(
        [
            "fuzz",
            "--spec",
            str(spec_file),
            "--impl",
            f"gather={_planted('offsets.py', 'gather_int16_block_ids')}",
            "--device",
            "cpu",
            "--cases",
            "2",
            "--shrink-budget",
            "3",
            "--out",
            str(out),
            "--quiet",
            "--in-process",
        ]
    )
    assert rc == 1
    bundle = next(b for b in (out / "bundles").iterdir() if b.name.startswith("VALUE_MISMATCH"))
    case = json.loads((bundle / "case.json").read_text())
    assert case["zero_blocks"] == {"src_cache": high} and case["spec"]["spec"]["paging"]["base_block"] == high
    stored = torch.load(bundle / "inputs.pt", weights_only=True)
    assert stored["src_cache"].shape[0] < 400 and (bundle / "inputs.pt").stat().st_size < 1 << 20
    assert main(["replay", str(bundle), "--impl", f"gather={_planted('offsets.py', 'gather_int16_block_ids')}"]) == 1
    assert main(["replay", str(bundle), "--impl", "gather=torch"]) == 0
    stored["src_cache"][0, 0, 0] ^= 1
    torch.save(stored, bundle / "inputs.pt")
    capsys.readouterr()
    assert main(["replay", str(bundle)]) == 2
    assert "does not match" in capsys.readouterr().err


def test_a_bundle_of_the_old_generator_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    main(
        [
            "fuzz",
            "--impl",
            f"gather={PLANTED / 'gather_from_zero.py'}:gather",
            "--device",
            "cpu",
            "--cases",
            "10",
            "--shrink-budget",
            "1",
            "--out",
            str(out),
            "--quiet",
            "--in-process",
        ]
    )
    bundle = next((out / "bundles").iterdir())
    case = json.loads((bundle / "case.json").read_text())
    for older in (1, 2):  # the CPU generator; sorted tables and slots
        (bundle / "case.json").write_text(json.dumps({**case, "schema_version": older}))
        capsys.readouterr()
        assert main(["replay", str(bundle)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "older mlafuzz" in err[0] and "bit-identically" in err[0]


# --- GPU: the fast path on the same inputs ------------------------------------------------

HUGE_32 = (1 << 32) // (64 * 656) + 1


def _gpu_specs():
    from mlafuzz.tests.support.gen_cases import every_layout_spec

    specs = [s for s in every_layout_spec() if s.op != "step"] + [
        s for s in every_layout_spec(base_block=300) if s.op != "step"
    ]
    specs += [
        dataclasses.replace(GATHER, paging=Paging(block_size=64, layout="shuffled", base_block=HUGE_32)),
        dataclasses.replace(
            WRITER, paging=Paging(block_size=64, spare_blocks=2, base_block=HUGE_32), inputs_view=View.COLUMNS
        ),
    ]
    return specs


@pytest.mark.gpu
@pytest.mark.parametrize("spec", _gpu_specs(), ids=lambda s: s.op)
def test_the_fast_path_clears_every_view_and_agrees_with_the_full_path(spec):
    """Our kernels on each layout: the fast path judges the case itself (it must not decline a view:
    a third of the cases have one) and finds nothing, and so does the full path."""
    from mlafuzz.harness.check.compare import Context
    from mlafuzz.harness.drive.run import fast_resources
    from mlafuzz.harness.fast.path import Clear, fast_path
    from mlafuzz.tests.support.helpers import OPS, session

    s = session()
    case = materialize(spec, 3, "cuda")
    op = OPS.get(spec.op)
    entry = resolve(spec.op, s.default_ref(spec.op, "cuda"))
    fn = s.load(entry, "cuda")
    result = fast_path(
        op=op,
        case=case,
        fn=fn,
        ctx=Context(op=op.name, impl=entry.name, case_id=case.case_id),
        rerun=True,
        sub=s.sub("cuda"),
        res=fast_resources(s),
    )
    assert isinstance(result, Clear), result
    assert run_case(case=case, entry=entry, rerun=True, fast=True).findings == ()
    assert run_case(case=case, entry=entry, rerun=True, fast=False).findings == ()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "spec, op, module, planted",
    [
        (dataclasses.replace(GATHER, table_view=View.COLUMNS), "gather", "contiguity.py", "gather_contiguous_table"),
        (dataclasses.replace(CONVERT, rows_view=View.ROWS), "convert", "contiguity.py", "convert_indices_from_row_0"),
        (dataclasses.replace(WRITER, inputs_view=View.COLUMNS), "writer", "contiguity.py", "writer_contiguous_inputs"),
        (
            dataclasses.replace(GATHER, paging=Paging(block_size=64, base_block=HUGE_32)),
            "gather",
            "offsets.py",
            "gather_int32_offsets",
        ),
    ],
    ids=["gather-table", "convert-rows", "writer-split", "gather-2**32"],
)
def test_planted_view_and_offset_bugs_are_found_through_the_fast_path(spec, op, module, planted):
    case = materialize(spec, 3, "cuda")
    found = run_case(case=case, entry=resolve(op, _planted(module, planted)), rerun=True, fast=True).findings
    assert Kind.VALUE_MISMATCH in {f.kind for f in found}
