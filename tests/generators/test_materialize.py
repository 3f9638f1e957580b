"""Materializers: (spec, seed) -> the same bytes and layouts every time, the call-site views of
SPEC 8, caches at the top of a larger one, and LARGE's bounds."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from mlafuzz.generators.case import clone_like
from mlafuzz.generators.draw import LARGE, SMALL
from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.ops.writer import WriterSpec
from mlafuzz.generators.spec import Paging, SpecError, View
from mlafuzz.tests.support.gen_cases import MEDIUM, differences, every_layout_spec, raw, storage_bytes
from mlafuzz.tests.support.helpers import OPS, draw_spec, materialize

OP_NAMES = ("convert", "gather", "writer", "step")


@pytest.mark.parametrize("knobs", [SMALL, MEDIUM], ids=["small", "medium"])
@pytest.mark.parametrize("op", OP_NAMES)
def test_the_same_spec_and_seed_give_the_same_bytes_and_layouts(op, knobs):
    for i in range(12):
        spec = draw_spec(op, seed=i, knobs=knobs)
        assert differences(materialize(spec, i), materialize(spec, i)) == []


@pytest.mark.parametrize("op", OP_NAMES)
def test_another_seed_gives_other_bytes(op):
    spec = next(
        s for i in range(50) if (s := draw_spec(op, seed=i, knobs=MEDIUM)) and sum(OPS.get(op).size(s).values()) > 40
    )
    a, b = materialize(spec, 1), materialize(spec, 2)
    changed = [
        k
        for k, t in a.tensors.items()
        if t is not None and t.numel() > 16 and not torch.equal(raw(t), raw(b.tensors[k]))
    ]
    assert changed, f"seeds 1 and 2 of {spec} made the same tensors"


def test_every_layout_spec_materializes_its_views():
    seen = collections.Counter()
    for spec in every_layout_spec():
        case = materialize(spec, 5)
        t = case.tensors
        for name, view in {"table_view": "block_table", "rows_view": "token_indices"}.items():
            if getattr(spec, name, View.PLAIN) is View.COLUMNS:
                assert t[view].stride(0) > t[view].shape[1] and t[view].stride(1) == 1, spec
                seen["columns"] += 1
            if getattr(spec, name, View.PLAIN) is View.ROWS:
                assert t[view].storage_offset() > 0 and t[view].is_contiguous(), spec
                seen["rows"] += 1
        if getattr(spec, "rows_view", None) is View.ROWS:
            assert t["req_id"].storage_offset() > 0  # req_id_per_token's rows, as the indices
        if getattr(spec, "dst_view", None) is View.ROWS:
            assert case.params["dst_rows_before"] > 0
            seen["dst"] += 1
        if isinstance(spec, WriterSpec) and spec.inputs_view is View.COLUMNS:
            kv_c, k_pe = t["kv_c"], t["k_pe"]
            assert kv_c.stride() == (576, 1) and k_pe.stride() == (576, 1)
            assert (
                k_pe.storage_offset() == 512 and kv_c.untyped_storage().data_ptr() == k_pe.untyped_storage().data_ptr()
            )
            seen["split"] += 1
    assert set(seen) == {"columns", "rows", "dst", "split"}


def test_a_view_holds_the_plain_tensor_and_valid_ids_around_it():
    plain = GatherSpec(
        requests=(GatherRequest(context_len=700, seq_start=130, length=300),),
        paging=Paging(block_size=16, layout="shuffled"),
    )
    base = materialize(plain, 3).tensors
    num_blocks = base["src_cache"].shape[0]
    for view in (View.COLUMNS, View.ROWS):
        table = materialize(dataclasses.replace(plain, table_view=view), 3).tensors["block_table"]
        assert torch.equal(table, base["block_table"])
        around = storage_bytes(table).view(torch.int32)
        assert around.numel() > table.numel() and int(around.min()) >= 0 and int(around.max()) < num_blocks


def test_a_cache_at_the_top_of_a_larger_one_makes_only_its_blocks():
    for spec in every_layout_spec(base_block=300):
        case = materialize(spec, 2)
        if isinstance(spec, ConvertSpec):  # no cache: its ids sit high
            table = case.tensors["block_table"]
            live = table[table != 0]
            assert int(live.min()) >= 300 and not case.zero_blocks
            continue
        name = "src_cache" if isinstance(spec, GatherSpec) else "kv_cache" if isinstance(spec, WriterSpec) else None
        if name is None:
            continue
        cache = case.tensors[name]
        assert case.zero_blocks == {name: 300} and not cache[:300].any() and cache[300:].any()
        assert torch.equal(case.generated_tensors()[name], cache[300:])
        low = materialize(dataclasses.replace(spec, paging=dataclasses.replace(spec.paging, base_block=0)), 2)
        assert torch.equal(cache[300:], low.tensors[name])  # the same blocks, renumbered
        if name == "kv_cache":
            slots = case.tensors["slot_mapping"]
            assert torch.equal(
                slots, torch.where(low.tensors["slot_mapping"] >= 0, low.tensors["slot_mapping"] + 300 * 16, -1)
            )


def test_a_4_gb_cache_costs_a_cpu_worker_only_its_blocks():
    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    spec = GatherSpec(
        requests=(GatherRequest(context_len=5000, seq_start=1000, length=2000),),
        paging=Paging(block_size=64, base_block=(1 << 32) // (64 * 656) + 1),
    )
    before = resident()
    case = materialize(spec, 1)
    copies = case.cloned_tensors()
    assert case.tensors["src_cache"].numel() > 1 << 32 and copies["src_cache"].numel() > 1 << 32
    assert int(case.tensors["block_table"].min()) * 64 * 656 > 1 << 32
    assert resident() - before < 128 << 20


def test_copies_keep_every_layout_and_the_bytes_around_a_view():
    for spec in every_layout_spec(base_block=7):
        case = materialize(spec, 4)
        copy = dataclasses.replace(case, tensors=case.cloned_tensors())
        assert differences(case, copy) == []
        for name, t in case.tensors.items():
            if t is not None and t.numel():
                assert copy.tensors[name].data_ptr() != t.data_ptr()
    strided = torch.arange(40).reshape(4, 10)[:, :3]
    assert clone_like(strided).stride() == (10, 1) and torch.equal(clone_like(strided), strided)


@pytest.mark.parametrize("op", ("convert", "gather", "writer", "step"))
def test_large_knobs_keep_every_case_within_the_worker_bound(op):
    """The bound the README states: rows, table entries and generated records capped, and a cache at
    most the largest base offset plus its records (the memory of one case and its working copy)."""
    kinds = collections.Counter()
    for i in range(300):
        spec = draw_spec(op, seed=i, knobs=LARGE)
        bs, base = spec.paging.block_size, spec.paging.base_block
        reqs = getattr(spec, "requests", ())
        rows = OPS.get(op).size(spec).get("rows", OPS.get(op).size(spec).get("tokens", 0))
        assert rows <= LARGE.max_rows + 1, spec
        if reqs and op != "step":
            need = max(-(-getattr(r, "seq_len", getattr(r, "context_len", 0)) // bs) for r in reqs)
            assert len(reqs) * (need + spec.paging.extra_table_cols) <= LARGE.max_table
        if op == "gather":
            records = sum(r.length // bs + 2 for r in reqs) * bs
            assert records <= LARGE.max_records + 2 * bs * len(reqs) + spec.paging.spare_blocks * bs
        if op == "writer":
            assert (-(-spec.num_tokens // bs) + spec.paging.spare_blocks) * bs <= LARGE.max_records + bs
        if op == "step":
            assert sum(r.seq_len for r in reqs) <= LARGE.max_records + 3 * LARGE.max_prefill_tokens * 4
        assert base * bs * 656 <= max(LARGE.base_offsets) + bs * 656
        kinds["high"] += bool(base)
        kinds.update(f for f in OPS.get(op).features(spec) if f.startswith("view:"))
    if op != "step":
        assert 3 <= kinds["high"] <= 40  # 1 in 20 of 300
    if op in ("convert", "gather"):
        assert all(kinds[f"view:table-{v}"] >= 20 for v in ("columns", "rows")), kinds


def test_large_knobs_draw_realistic_sizes():
    specs = [draw_spec("convert", seed=i, knobs=LARGE) for i in range(400)]
    ks = collections.Counter(s.topk for s in specs)
    assert ks.most_common(1)[0][0] == 2048
    assert max(len(s.requests) for s in specs) == 256 and min(len(s.requests) for s in specs) == 1
    assert max(r.seq_len for s in specs for r in s.requests) > 100_000
    rows = [sum(r.num_tokens for r in s.requests) for s in specs]
    assert sorted(rows)[len(rows) // 2] < 1000 < max(rows)  # many small, some huge
    at_tiles = sum(
        any(abs(n - m * t) <= 1 for t in (128, 256, 1024) for m in range(1, 129) if m * t > 100) for n in rows
    )
    assert at_tiles >= 30


def test_views_are_checked_per_tensor():
    with pytest.raises(SpecError, match="rows_view"):
        ConvertSpec(requests=(ConvertRequest(seq_len=1, num_tokens=1),), rows_view="columns")
    with pytest.raises(SpecError, match="dst_view"):
        GatherSpec(requests=(GatherRequest(context_len=1),), dst_view="columns")
    with pytest.raises(SpecError, match="inputs_view"):
        WriterSpec(num_tokens=1, inputs_view="rows")


def test_the_step_before_reverses_each_row_and_sets_its_first_valid_column_to_minus_one():
    """A two-step caller-out case's first top-k rows (SPEC 9.2), row by row as step_before says:
    columns reversed, the first valid one (a token in [0, tokens)) set to -1; a row without one
    gets token 0 in its first column."""
    from mlafuzz.generators.ops.convert import step_before

    g = torch.Generator().manual_seed(3)
    rows = torch.randint(-3, 12, (40, 16), generator=g, dtype=torch.int32)
    rows[5] = -1  # no valid column
    rows[6] = 11  # none below tokens either
    tokens = 10
    expected = []
    for row in rows.tolist():
        prev = row[::-1]
        valid = [j for j, v in enumerate(prev) if 0 <= v < tokens]
        if valid:
            prev[valid[0]] = -1
        else:
            prev[0] = 0
        expected.append(prev)
    assert step_before(rows, tokens=tokens).tolist() == expected
    assert step_before(rows[:, :0], tokens=tokens).shape == (40, 0)
