"""The vectorized nvfp4 oracles give the same bits on CUDA as on the CPU (bucketize tables,
tensor-by-tensor division and multiplication: no reciprocal folding, no fast-math on the device)."""

from __future__ import annotations

import math

import pytest
import torch

from mlafuzz.oracles.formats import writer_rules
from mlafuzz.oracles.formats.minifloat import e2m1_rn_satfinite, e4m3_rn_satfinite
from mlafuzz.oracles.formats.nvfp4_gather import gather, gather_fp8
from mlafuzz.oracles.formats.nvfp4_read import dequant, stage_fp8
from mlafuzz.oracles.formats.nvfp4_ties import quotient_rule_disagreements
from mlafuzz.oracles.formats.nvfp4_write import encode_rows, write_records

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_roundings_match_the_cpu_on_every_bf16_pattern() -> None:
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    for fn in (e2m1_rn_satfinite, e4m3_rn_satfinite):
        assert torch.equal(fn(x.cuda()).cpu(), fn(x))


@pytest.mark.parametrize("revision", writer_rules.names())
def test_writer_and_readers_match_the_cpu(revision: str) -> None:
    gen = torch.Generator().manual_seed(5)
    kv = (torch.randn(64, 512, generator=gen) * torch.exp2(torch.randint(-14, 12, (64, 1), generator=gen))).to(
        torch.bfloat16
    )
    kv[0, :16] = torch.tensor([5.5, 4.6875, 2.34375, 1.171875] + [0.0] * 11 + [math.nan])
    pe = (torch.randn(64, 64, generator=gen) * 300).to(torch.bfloat16)
    rec = encode_rows(kv_c=kv, k_pe=pe, revision=revision)
    assert torch.equal(encode_rows(kv_c=kv.cuda(), k_pe=pe.cuda(), revision=revision).cpu(), rec)
    cache = torch.zeros(9, 8, 352, dtype=torch.uint8)
    slots = torch.randperm(72, generator=gen)[:64]
    want = write_records(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=slots, revision=revision)
    got = write_records(
        kv_c=kv.cuda(), k_pe=pe.cuda(), kv_cache=cache.cuda(), slot_mapping=slots.cuda(), revision=revision
    )
    assert torch.equal(got.cpu(), want)
    noise = torch.randint(0, 256, (16, 352), dtype=torch.uint8, generator=gen)
    both = torch.cat([rec, noise])
    assert torch.equal(dequant(both.cuda()).cpu().view(torch.int16), dequant(both).view(torch.int16))
    for inv in (1.0, 0.37):
        assert torch.equal(stage_fp8(both.cuda(), inv_scale=inv).cpu(), stage_fp8(both, inv_scale=inv))
    call = dict(
        block_table=torch.tensor([[3, 1, 0], [2, 8, 5]], dtype=torch.int32),
        workspace_starts=torch.tensor([0, 11], dtype=torch.int32),
        batch_size=2,
        seq_starts=torch.tensor([5, 2], dtype=torch.int32),
        total=20,
    )
    on_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in call.items()}
    assert torch.equal(
        gather(src_cache=want.cuda(), **on_gpu).cpu().view(torch.int16),
        gather(src_cache=want, **call).view(torch.int16),
    )
    assert torch.equal(
        gather_fp8(src_cache=want.cuda(), inv_scale=0.5, **on_gpu).cpu(),
        gather_fp8(src_cache=want, inv_scale=0.5, **call),
    )


def test_the_42_quotient_pairs_are_the_same_on_the_device() -> None:
    assert quotient_rule_disagreements(device="cuda") == quotient_rule_disagreements()
