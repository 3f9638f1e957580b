"""`mlafuzz bench`'s nvfp4_ds_mla rows, off the GPU: each prints right after its fp8_ds_mla
sibling, and the gather row's call and byte count are those of the job it names."""

from __future__ import annotations

import torch

from mlafuzz.harness.bench.kernels import bench_order
from mlafuzz.harness.ops.table import OPS
from mlafuzz.oracles.formats import nvfp4_read
from mlafuzz.tests.support.helpers import resolve


def test_bench_prints_each_nvfp4_row_right_after_its_fp8_ds_mla_row():
    benched = [o.name for o in OPS.ops if o.bench is not None]
    order = bench_order(benched)
    assert sorted(order) == sorted(benched)
    assert order[order.index("gather") + 1] == "nvfp4_gather"
    assert order[order.index("writer") + 1] == "nvfp4_writer"
    assert bench_order(["nvfp4_gather", "convert"]) == ["nvfp4_gather", "convert"]  # alone: where asked


def test_the_nvfp4_gather_row_upconverts_every_record_once_and_counts_its_bytes():
    gather = resolve("nvfp4_gather", "torch").load("cpu")
    seen = []

    def timed(*args):
        seen.append(args)
        return gather(*args)

    wl = OPS.get("nvfp4_gather").bench.workload({"torch": timed}, requests=2, context=128, bs=64, device="cpu")
    tokens = 2 * 128
    assert wl.nbytes == tokens * 352 + tokens * 576 * 2 + (tokens // 64) * 4  # records, bf16 rows, table
    assert wl.name == "nvfp4_gather 2 req x 128 ctx, bs 64"
    wl.run["torch"]()
    cache, dst, table, _starts, batch, _seq = seen[0]
    assert batch == 2 and sorted(table.reshape(-1).tolist()) == list(range(cache.shape[0]))  # each block once
    records = cache[table.reshape(-1).long()].reshape(tokens, 352)  # request by request, block by block
    # random RoPE bytes hold e4m3 NaNs: equal as values, NaN where NaN
    torch.testing.assert_close(dst, nvfp4_read.dequant(records), rtol=0, atol=0, equal_nan=True)
