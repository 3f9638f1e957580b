"""Our CUDA gather's host tier (SPEC 9.3) against the oracle on the GPU: drawn host-tier cases bit
for bit (the host cache pinned, read in place), and a fuzz run of the gather with the host tier
drawing 0 findings. Run on the H200:

    .venv/bin/python -m pytest -q -m gpu tests/kernels/test_cuda_gather_host.py
"""

from __future__ import annotations

import json

import pytest
import torch

from mlafuzz.generators.draw import draw_with_seed
from mlafuzz.generators.ops import gather as gen
from mlafuzz.harness.cli.main import main
from mlafuzz.kernels import cuda_ext
from mlafuzz.oracles import gather as og
from mlafuzz.tests.support.cuda_cases import assert_rows_equal, gpu

HOST_SEEDS = [s for s in range(300) if draw_with_seed(gen.draw, seed=s).host is not None][:64]


@gpu
@pytest.mark.parametrize("force_scalar", [False, True], ids=["vector", "scalar"])
def test_our_cuda_gather_reads_both_tiers_bit_for_bit(force_scalar):
    for seed in HOST_SEEDS:
        case = gen.materialize(draw_with_seed(gen.draw, seed=seed), seed=seed, device="cuda")
        t, p = case.tensors, case.params
        assert t["host_cache"].is_pinned()
        expected = og.gather(
            src_cache=t["src_cache"],
            block_table=t["block_table"],
            workspace_starts=t["workspace_starts"],
            batch_size=p["batch_size"],
            seq_starts=t["seq_starts"],
            total=p["total"],
            **{k: t[k] for k in gen.HOST_ARGS},
        )
        dst = torch.full((p["total"], 576), -7.0, dtype=torch.bfloat16, device="cuda")
        cuda_ext.gather_impl(
            t["src_cache"],
            dst,
            t["block_table"],
            t["workspace_starts"],
            p["batch_size"],
            t["seq_starts"],
            *(t[k] for k in gen.HOST_ARGS),
            force_scalar=force_scalar,
        )
        torch.cuda.synchronize()
        assert_rows_equal(dst, expected, f"seed {seed}")


@gpu
def test_our_cuda_gather_refuses_an_unpinned_host_cache():
    seed = HOST_SEEDS[0]
    case = gen.materialize(draw_with_seed(gen.draw, seed=seed), seed=seed, device="cuda")
    t, p = case.tensors, case.params
    dst = torch.empty((p["total"], 576), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="pinned"):
        cuda_ext.gather(
            t["src_cache"],
            dst,
            t["block_table"],
            t["workspace_starts"],
            p["batch_size"],
            t["seq_starts"],
            torch.from_numpy(t["host_cache"].numpy().copy()),  # the same bytes, not pinned
            t["host_row_ids"],
            t["device_row_ids"],
        )


@gpu
def test_fuzzing_our_cuda_gather_with_the_host_tier_finds_nothing(tmp_path):
    rc = main(
        ["fuzz", "--op", "gather", "--impl", "gather=cuda", "--device", "cuda", "--cases", "400"]
        + ["--out", str(tmp_path), "--quiet"]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["findings"] == 0 and rc == 0, summary["by_kind"]
    assert {"host:mixed", "host:all", "host:remap", "host:chunk-call"} <= set(summary["coverage"])
