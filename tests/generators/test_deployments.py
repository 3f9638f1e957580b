"""Compile-aware draws: a run's convert cases come from a few deployments, and runs cover every option.

A Triton convert written as vLLM writes it compiles once per combination of its tl.constexpr
options and of Triton's int specializations (value 1, divisibility by 16): its compile key here."""

from __future__ import annotations

from collections import defaultdict

import pytest

from mlafuzz.generators.draw import KNOB_PRESETS, RandomDrawer, draw_with_seed
from mlafuzz.generators.ops.convert import ConvertSpec, draw
from mlafuzz.generators.spec import View
from mlafuzz.harness.drive.fuzz import case_seed


def width(spec: ConvertSpec) -> int:
    return max(-(-r.seq_len // spec.paging.block_size) for r in spec.requests) + spec.paging.extra_table_cols


def compile_key(spec: ConvertSpec) -> tuple:
    """What the vLLM-like convert (tests/support/planted/vllm_like_convert.py) compiles on."""
    return (
        width(spec),
        spec.paging.block_size,
        spec.block_stride_rows,
        spec.block_n,
        spec.topk,
        spec.prefill_workspace,
        spec.return_valid_counts,
        spec.compact,
        spec.table_view,
        spec.rows_view,
    )


def run_specs(size: str, seed: int, cases: int) -> list[ConvertSpec]:
    """The convert specs of cases 0..cases-1 of a run, as the fuzz loop's tasks draw them."""
    knobs = KNOB_PRESETS[size].for_run(seed)
    return [draw_with_seed(draw, seed=case_seed(seed, "convert", i), knobs=knobs) for i in range(cases)]


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_runs_convert_cases_compile_at_most_one_variant_per_deployment(size):
    pool = KNOB_PRESETS[size].deployments
    keys = {seed: {compile_key(s) for s in run_specs(size, seed, 300)} for seed in (0, 1)}
    assert 2 <= len(keys[0]) <= pool and 2 <= len(keys[1]) <= pool
    assert keys[0] != keys[1]  # the deployments change with the run seed


def test_without_a_run_seed_every_case_draws_its_own_options():
    keys = {compile_key(draw_with_seed(draw, seed=s, knobs=KNOB_PRESETS["small"])) for s in range(300)}
    assert len(keys) > 100


@pytest.mark.parametrize("size", ["small", "large"])
def test_over_runs_every_option_value_and_every_int_specialization_appears(size):
    knobs = KNOB_PRESETS[size]
    seen: dict[str, set] = defaultdict(set)
    for seed in range(12):
        for s in run_specs(size, seed, 60):
            w = width(s)
            seen["block_size"].add(s.paging.block_size)
            seen["block_n"].add(s.block_n)
            seen["topk_multiple"].add(s.topk // s.block_n)
            seen["prefill_workspace"].add(s.prefill_workspace)
            seen["return_valid_counts"].add(s.return_valid_counts)
            seen["compact"].add(s.compact)
            seen["stride"].add(s.block_stride_rows is None)
            seen["stride_equal"].add(s.block_stride_rows == s.paging.block_size)
            seen["table_view"].add(s.table_view)
            seen["rows_view"].add(s.rows_view)
            seen["width"].add("one" if w == 1 else "x16" if w % 16 == 0 else "other")
    assert seen["block_size"] == set(knobs.block_sizes)
    assert seen["block_n"] == set(knobs.block_ns)
    assert seen["topk_multiple"] == set(knobs.topk_multiples) | set(knobs.odd_topk_multiples)
    for flag in ("prefill_workspace", "return_valid_counts", "compact", "stride", "stride_equal"):
        assert seen[flag] == {False, True}, flag
    assert seen["table_view"] == {View.PLAIN, View.COLUMNS, View.ROWS}
    assert seen["rows_view"] == {View.PLAIN, View.ROWS}
    assert seen["width"] == {"one", "x16", "other"}


def test_every_value_of_a_short_option_list_appears_in_every_run():
    for seed in range(5):
        specs = run_specs("small", seed, 200)
        assert {s.paging.block_size for s in specs} == set(KNOB_PRESETS["small"].block_sizes)
        assert {s.prefill_workspace for s in specs} == {False, True}


def test_case_i_is_a_pure_function_of_the_run_seed_and_i():
    assert run_specs("large", 7, 20) == run_specs("large", 7, 20)
    drawer = RandomDrawer(3)
    assert drawer.integer(0, 5) == RandomDrawer(3).integer(0, 5)
