"""The gather's host tier (SPEC 9.3) in our torch gather and the capability detection, on the
CPU: fuzzing finds nothing, each host error input is refused by name, a gather whose signature
names the three arguments gets host-tier cases (one that does not never does).
The fast path's own judgement of host-tier cases: tests/fast/test_host_tier.py."""

from __future__ import annotations

import json

import pytest

from mlafuzz.generators.draw import draw_with_seed
from mlafuzz.generators.ops import gather as gen
from mlafuzz.harness.cli.main import main
from mlafuzz.kernels import torch_impl
from mlafuzz.kernels.checks import GATHER_TORCH_REJECTS, InvalidInputError
from mlafuzz.kernels.external import adapt_signature

HOST_SEED = next(s for s in range(100) if (sp := draw_with_seed(gen.draw, seed=s)).host and sp.host.host_pct == 50)


def test_fuzzing_our_torch_gather_with_the_host_tier_finds_nothing(tmp_path):
    rc = main(
        ["fuzz", "--op", "gather", "--impl", "gather=torch", "--device", "cpu", "--cases", "60"]
        + ["--out", str(tmp_path), "--quiet"]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0 and summary["findings"] == 0
    assert {"host:mixed", "host:remap", "host:chunk-call"} <= set(summary["coverage"])


def _ours(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    pass


def _hisparse(
    src_cache,
    dst,
    block_table,
    workspace_starts,
    batch_size,
    seq_starts=None,
    host_cache=None,
    host_row_ids=None,
    device_row_ids=None,
):
    pass


def test_only_a_gather_that_names_the_three_host_arguments_gets_host_tier_cases():
    assert "host_tier" in adapt_signature("gather", _hisparse)[1]
    assert "host_tier" not in adapt_signature("gather", _ours)[1]
    spec = draw_with_seed(gen.draw, seed=HOST_SEED)
    assert gen.fit(spec, frozenset({"seq_starts"})).host is None
    assert gen.fit(spec, frozenset({"seq_starts", "host_tier"})) == spec


def _call(case):
    t = case.tensors
    dst = torch_impl.torch.empty(case.params["total"], 576, dtype=torch_impl.torch.bfloat16)
    host = {k: t[k] for k in gen.HOST_ARGS}
    torch_impl.gather_torch(
        t["src_cache"], dst, t["block_table"], t["workspace_starts"], case.params["batch_size"], t["seq_starts"], **host
    )


@pytest.mark.parametrize(
    "klass",
    [k for k in gen.HOST_INVALID + gen.HOST_VALUE_INVALID if k.name != "host_wrong_device"],
    ids=lambda k: k.name,
)
def test_our_torch_gather_refuses_each_host_error_input_by_name(klass):
    assert klass.name in GATHER_TORCH_REJECTS or klass in gen.HOST_VALUE_INVALID
    made = [
        k
        for s in range(150)
        if (sp := draw_with_seed(gen.draw, seed=s)).host is not None
        and (k := klass.make(gen.materialize(sp, seed=s, device="cpu"))) is not None
    ]
    assert made, f"{klass.name} never applied"
    for bad in made[:3]:
        with pytest.raises(InvalidInputError) as err:
            _call(bad)
        assert err.value.reason == klass.name


def _writes_to_its_inputs(
    src_cache,
    dst,
    block_table,
    workspace_starts,
    batch_size,
    seq_starts=None,
    host_cache=None,
    host_row_ids=None,
    device_row_ids=None,
):
    torch_impl.gather_torch(
        src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache, host_row_ids, device_row_ids
    )
    host_cache[0, 0] ^= 1  # the host tier's tensors are inputs: INPUT_MUTATION covers them
    device_row_ids.view(-1)[-1] = 7


def test_a_gather_that_writes_the_host_cache_or_a_map_draws_input_mutation():
    from mlafuzz.tests.support.helpers import resolve, run_case

    entry = resolve("gather", "torch")
    case = gen.materialize(draw_with_seed(gen.draw, seed=HOST_SEED), seed=HOST_SEED, device="cpu")
    result = run_case(case=case, entry=entry, fn=_writes_to_its_inputs)
    mutated = {f.tensor for f in result.findings if f.kind.value == "INPUT_MUTATION"}
    assert mutated == {"host_cache", "device_row_ids"}, result.findings
