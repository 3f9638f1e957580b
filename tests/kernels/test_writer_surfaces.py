"""The writer as vLLM's call sites make it (SPEC 8, 10): concat_and_cache_mla's ``skip_scale``
(0.33.0; no effect on fp8_ds_mla records) and a cache that is one layer of a packed multi-layer
cache (the other layers' bytes must stay as they were); the look-alike mutants of sglang #36207 and
vLLM #57019 killed on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlafuzz.generators.draw import SMALL, Knobs
from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels import torch_impl
from mlafuzz.kernels.entry import ImplEntry
from mlafuzz.kernels.external import adapt_signature
from mlafuzz.kernels.registry import Registry, default_registry
from mlafuzz.tests.support.helpers import run_case

WRITER = OPS.get("writer")


def _specs(count: int, knobs: Knobs = SMALL) -> list:
    return [OPS.draw_spec("writer", seed=s, knobs=knobs) for s in range(count)]


@pytest.mark.parametrize("knobs", [SMALL, Knobs()], ids=["small", "default"])
def test_packed_layer_views_and_skip_scale_are_drawn_within_a_few_dozen_cases(knobs):
    specs = _specs(40, knobs)
    assert sum(s.layers > 1 for s in specs) >= 4  # one layer >= 1 of 2..4: a non-zero storage offset
    assert all(s.layer >= 1 for s in specs if s.layers > 1)
    assert {s.skip_scale for s in specs} == {None, False, True}


def test_a_packed_layer_is_a_view_at_its_layers_offset_and_its_copy_keeps_the_other_layers():
    spec = next(s for s in _specs(40) if s.layers > 1 and s.num_tokens)
    case = OPS.materialize(spec, 0, "cpu")
    cache = case.tensors["kv_cache"]
    assert cache.storage_offset() == spec.layer * cache.numel()
    assert cache.untyped_storage().nbytes() == spec.layers * cache.numel()
    copy = case.cloned_tensors()["kv_cache"]
    assert copy.storage_offset() == cache.storage_offset()
    assert torch.equal(_whole(copy), _whole(cache))


def _whole(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def test_skip_scale_changes_no_byte_of_our_writers_records():
    for spec in _specs(12):
        case = OPS.materialize(dataclasses.replace(spec, skip_scale=None, layers=1, layer=0), 1, "cpu")
        made = []
        for skip in ({}, {"skip_scale": False}, {"skip_scale": True}):
            t = case.cloned_tensors()
            torch_impl.writer_torch(
                t["kv_c"], t["k_pe"], t["kv_cache"], t["slot_mapping"], "fp8_ds_mla", t["scale"], **skip
            )
            made.append(t["kv_cache"])
        assert torch.equal(made[0], made[1]) and torch.equal(made[0], made[2])


def _both_layers(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="fp8_ds_mla", scale=None, *, revision):
    """Right in its own layer, and the same records again at the storage's start (layer 0)."""
    torch_impl.writer_torch(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, revision=revision)
    base = torch.as_strided(kv_cache, kv_cache.shape, kv_cache.stride(), 0)
    torch_impl.writer_torch(kv_c, k_pe, base, slot_mapping, kv_cache_dtype, scale, revision=revision)


def test_a_writer_that_also_writes_layer_0_is_caught_on_the_other_layers():
    entry = dataclasses.replace(
        default_registry().get("writer", "torch"),
        name="both_layers",
        loader=lambda device: _both_layers,
        capabilities=frozenset(),
    )
    hits = 0
    for seed, spec in enumerate(_specs(40)):
        if spec.layers == 1 or not spec.num_tokens or spec.padding and spec.num_tokens < 2:
            continue
        case = OPS.materialize(WRITER.fit(spec, entry.capabilities), seed, "cpu")
        findings = run_case(case=case, entry=entry, fast=False).findings
        assert {(f.kind.value, f.tensor) for f in findings} == {("VALUE_MISMATCH", "other_layers")}, findings
        hits += 1
    assert hits >= 3


def test_a_writer_that_names_skip_scale_has_the_capability_and_an_older_one_is_never_passed_it(tmp_path):
    assert "skip_scale" in adapt_signature("writer", torch_impl.writer_torch)[1]

    def older(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *, revision="2026-10"):
        torch_impl.writer_torch(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, revision=revision)

    fn, caps = adapt_signature("writer", older)
    assert "skip_scale" not in caps
    entry = ImplEntry(op="writer", name="older", loader=lambda device: fn, devices=frozenset({"cpu"}),
                      rejects=frozenset(), capabilities=caps)  # fmt: skip
    session = Session(table=OPS, registry=Registry.of((*default_registry().entries(), entry)))
    config = FuzzConfig(ops=("writer",), impls={"writer": "older"}, device="cpu", cases=30, seed=3, out_dir=tmp_path)
    summary = fuzz(config, executor=InProcess(session=session))
    assert summary.findings == 0 and not summary.coverage["skip_scale:on"], summary.by_kind


def test_our_torch_writer_stays_clean_on_packed_layers_and_skip_scale(tmp_path):
    config = FuzzConfig(ops=("writer",), impls={"writer": "torch"}, device="cpu", cases=40, seed=2, out_dir=tmp_path)
    summary = fuzz(config, executor=InProcess(session=Session(table=OPS)))
    assert summary.cases == 40 and summary.findings == 0, summary.by_kind
    assert summary.coverage["cache:packed-layers"] and summary.coverage["skip_scale:on"]


@pytest.mark.parametrize("mutant", ["writer_padding_nan_slot0", "writer_layer_base_offset", "writer_skip_scale_tile"])
def test_each_new_writer_look_alike_is_killed_with_its_kind_on_the_cpu(tmp_path, mutant):
    config = FuzzConfig(ops=("writer",), impls={"writer": mutant}, device="cpu", cases=40, seed=0, out_dir=tmp_path)
    summary = fuzz(config, executor=InProcess(session=Session(table=OPS)))
    assert set(summary.by_kind) == {"VALUE_MISMATCH"}, summary.by_kind


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_packed_layer_case_skips_the_fast_path_and_the_full_path_catches_layer_0(device):
    from mlafuzz.harness.fast import writer as fast_writer

    entry = default_registry().get("writer", "writer_layer_base_offset")
    # Fitted to the mutant as a run fits it: a spec that passes skip_scale would be a counted skip
    # ("impl lacks capability"), and a skip is no finding.
    spec = next(s for s in _specs(40) if s.layers > 1 and s.num_tokens)
    spec = OPS.get("writer").fit(spec, entry.capabilities)
    case = OPS.materialize(spec, 0, device)
    assert not fast_writer.takes(case)
    result = run_case(case=case, entry=entry, fast=device == "cuda")
    assert result.skipped is None and {f.kind.value for f in result.findings} == {"VALUE_MISMATCH"}
