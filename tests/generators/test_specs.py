"""Specs: validated at construction, JSON round trip, deterministic materialization."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.generators.ops.convert import ConvertRequest, ConvertSpec
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.spec import Paging, SpecError, TopkMode, ValueMode, spec_to_json
from mlafuzz.tests.support.helpers import draw_spec, materialize, spec_from_json, specs

OPS = ("convert", "gather")


def _same_tensors(a, b) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if (x is None) != (y is None):
            return False
        if x is not None and not (
            x.dtype == y.dtype
            and x.shape == y.shape
            and torch.equal(
                x.reshape(-1).view(torch.uint8) if x.is_floating_point() else x,
                y.reshape(-1).view(torch.uint8) if y.is_floating_point() else y,
            )
        ):
            return False
    return True


@pytest.mark.parametrize("op", OPS)
@given(data=st.data())
@settings(max_examples=30)
def test_every_drawn_spec_survives_a_json_round_trip(op, data):
    spec = data.draw(specs(op))
    assert spec_from_json(spec_to_json(spec)) == spec


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_same_spec_and_seed_give_bit_identical_tensors(op, seed):
    spec = draw_spec(op, seed=seed)
    a, b = materialize(spec, seed, "cpu"), materialize(spec, seed, "cpu")
    assert _same_tensors(a.tensors, b.tensors)
    assert a.case_id == b.case_id and dict(a.params) == dict(b.params)


def test_another_seed_gives_other_values():
    spec = GatherSpec(requests=(GatherRequest(context_len=64, length=64),), values=ValueMode.ALL_CODES)
    a, b = materialize(spec, 1, "cpu"), materialize(spec, 2, "cpu")
    assert not torch.equal(a.tensors["src_cache"], b.tensors["src_cache"])


def test_materialize_does_not_touch_the_global_rng():
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    materialize(draw_spec("gather", seed=3), 3, "cpu")
    assert torch.equal(torch.rand(3), before)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: Paging(block_size=0), "block_size=0"),
        (lambda: ConvertSpec(requests=(ConvertRequest(seq_len=4, num_tokens=1),), topk=96, block_n=64), "topk=96"),
        (lambda: ConvertSpec(requests=(ConvertRequest(seq_len=4, num_tokens=1),), block_n=48, topk=96), "block_n=48"),
        (lambda: GatherRequest(context_len=4, seq_start=3, length=2), "length=2"),
        (lambda: GatherSpec(requests=()), "requests=()"),
        (lambda: ConvertRequest(seq_len="3", num_tokens=1), "seq_len='3'"),
    ],
)
def test_invalid_specs_are_refused_with_name_equals_value(bad, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bad()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["spec"].update(bogus=1), "unknown field 'bogus'"),
        (lambda d: d["spec"]["paging"].update(block_size="64"), "block_size='64' must be an integer"),
        (lambda d: d["spec"].update(values="shiny"), "values='shiny' must be one of"),
        (lambda d: d.update(schema_version=99), "schema_version=99"),
        (lambda d: d.update(op="attention"), "op='attention'"),
        (lambda d: d["spec"]["requests"][0].pop("context_len"), "context_len"),
    ],
)
def test_bad_spec_files_fail_with_one_line(mutate, message):
    data = json.loads(spec_to_json(GatherSpec(requests=(GatherRequest(context_len=4, length=2),))))
    mutate(data)
    with pytest.raises(SpecError) as info:
        spec_from_json(json.dumps(data))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_block_table_covers_every_request_and_shared_prefix_shares_blocks():
    spec = GatherSpec(
        requests=(GatherRequest(context_len=200, length=10), GatherRequest(context_len=130, length=5)),
        paging=Paging(block_size=16, layout="shared_prefix"),
    )
    case = materialize(spec, 5, "cpu")
    table = case.tensors["block_table"]
    num_blocks = case.tensors["src_cache"].shape[0]
    assert table.shape[1] >= 13 and int(table[:, :9].max()) < num_blocks
    assert torch.equal(table[0, :4], table[1, :4])  # prefix caching: same physical blocks


@pytest.mark.parametrize("mode", list(TopkMode))
def test_topk_modes_produce_their_index_classes(mode):
    spec = ConvertSpec(
        requests=(ConvertRequest(seq_len=100, num_tokens=8),),
        paging=Paging(block_size=16),
        topk=256,
        block_n=64,
        topk_mode=mode,
    )
    idx = materialize(spec, 11, "cpu").tensors["token_indices"]
    width = 7 * 16  # ceil(100 / 16) = 7 blocks
    present = {
        "valid": bool(((idx >= 0) & (idx < 100)).any()),
        "negative_other": bool((idx < -1).any()),
        "past_table": bool((idx >= width).any()),
        "past_seq_len": bool(((idx >= 100) & (idx < width)).any()),
    }
    expected = {
        TopkMode.VALID: {"valid"},
        TopkMode.PADDED: {"valid"},
        TopkMode.NEGATIVE: {"valid", "negative_other"},
        TopkMode.PAST_TABLE: {"valid", "past_table"},
        TopkMode.PAST_SEQ_LEN: {"valid", "past_seq_len"},
        TopkMode.MIXED: {"valid", "negative_other", "past_table", "past_seq_len"},
    }[mode]
    assert {k for k, v in present.items() if v} == expected


def test_all_codes_mode_uses_every_fp8_code():
    spec = GatherSpec(requests=(GatherRequest(context_len=4, length=4),), values=ValueMode.ALL_CODES)
    cache = materialize(spec, 0, "cpu").tensors["src_cache"]
    codes = cache.reshape(-1, 656)[:, :512]
    assert torch.unique(codes).numel() == 256


def test_cumulative_workspace_starts_carry_one_more_entry():
    reqs = (
        GatherRequest(context_len=10, length=3),
        GatherRequest(context_len=10, length=0),
        GatherRequest(context_len=10, seq_start=4, length=6),
    )
    exact = materialize(GatherSpec(requests=reqs), 0, "cpu")
    cum = materialize(GatherSpec(requests=reqs, ws_form="cumulative"), 0, "cpu")
    assert exact.tensors["workspace_starts"].tolist() == [0, 3, 3]
    assert cum.tensors["workspace_starts"].tolist() == [0, 3, 3, 9]
    assert exact.params["total"] == 9 and exact.tensors["seq_starts"].tolist() == [0, 0, 4]


def test_a_strided_inputs_copy_keeps_its_strides_and_the_bytes_between_its_elements():
    from mlafuzz.generators.invalid import with_

    case = materialize(GatherSpec(requests=(GatherRequest(context_len=20, length=20),) * 3), 1)
    wide = torch.arange(3 * 9, dtype=torch.int32).reshape(3, 9)
    both = torch.randn(4, 576).to(torch.bfloat16)
    case = with_(case, tensors={"block_table": wide[:, 2:5], "k_pe_like": both[:, 512:]})
    copies = case.cloned_tensors()
    for name in ("block_table", "k_pe_like"):
        view, copy = case.tensors[name], copies[name]
        assert copy.stride() == view.stride() and torch.equal(copy, view)
        assert copy.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    # What a kernel assuming contiguity reads there: the case's own values, not uninitialized memory.
    flat = copies["block_table"].as_strided((3 * 3,), (1,))
    assert flat.tolist() == wide.reshape(-1)[2:11].tolist()
    assert torch.equal(copies["k_pe_like"].as_strided((64 + 576,), (1,)), both.reshape(-1)[512 : 512 + 640])
