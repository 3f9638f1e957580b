"""An op's facts live in its op table row: bench, vLLM's candidates, the fast path and its generator
read the row, so an op lacking one of them is told so in one line, never looked up in a list."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.cli.main import main
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.entry import ImplError
from mlafuzz.kernels.registry import default_registry


def test_bench_times_every_row_with_a_workload_against_a_registered_implementation_of_ours():
    benched = [o for o in OPS.ops if o.bench is not None]
    assert benched, "no op has a bench workload"
    for op in benched:
        entry = default_registry().get(op.name, op.ours)
        assert entry is not None and "cuda" in entry.devices, op.name


def test_bench_of_an_op_without_a_workload_is_a_one_line_mistake(capsys):
    lacking = next(o.name for o in OPS.ops if o.bench is None)
    assert main(["bench", "--op", lacking]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"no workload for op {lacking}" in line


def test_vllm_is_looked_up_where_the_row_says_and_refused_for_a_row_without_candidates():
    with_candidates = next(o for o in OPS.ops if o.vllm)
    table = OpTable(tuple(dataclasses.replace(o, vllm=()) if o is with_candidates else o for o in OPS.ops))
    with pytest.raises(ImplError, match=f"vllm has no implementation of op {with_candidates.name!r}"):
        Session(table=table).entry(with_candidates.name, "vllm")


def test_list_names_vllm_for_exactly_the_rows_with_candidates(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    current, has = None, {}
    for line in out.splitlines():
        if not line.startswith(" ") and not line.startswith("external"):
            current = line.strip()
            has[current] = False
        elif current is not None and line.split()[:1] == ["vllm"]:
            has[current] = True
    assert has == {o.name: bool(o.vllm) for o in OPS.ops}


def test_every_fast_check_a_row_names_is_a_module_of_the_fast_room():
    for op in OPS.ops:
        if op.fast is not None:
            assert importlib.util.find_spec(f"mlafuzz.harness.fast.{op.fast}") is not None, op.name


def test_a_row_reads_its_generator_whole():
    for op in OPS.ops:
        g = op.generator
        assert (op.spec_type, op.draw, op.materialize, op.invalid) == (g.spec_type, g.draw, g.materialize, g.invalid)
        assert op.spec_type.op == op.name
