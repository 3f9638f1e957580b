"""The vectorized oracles give the same bits on CUDA as on the CPU.

The oracles promise to run on the device of their inputs; their roundings are
integer bit manipulation and plain IEEE tensor ops, so CUDA must match the CPU
(which the other test files hold to the loop versions) bit for bit.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch

from mlafuzz.oracles.codec import RECORD_BYTES, dequant_records, encode_rows, write_records
from mlafuzz.oracles.convert import convert
from mlafuzz.oracles.gather import gather

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SCALES = [
    1.0,
    0.5,
    2.0**-126,
    1e-45,
    1e-40,
    3.4e38,
    1e30,
    2.0**-140,
    0.0,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    1 / 448,
    1e-3,
    7.0,
]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype in (torch.bfloat16, torch.float16):
        a, b = a.view(torch.int16), b.view(torch.int16)
    return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def test_dequant_all_codes_times_edge_scales_and_random_records_match_cpu() -> None:
    gen = torch.Generator().manual_seed(0)
    recs = torch.randint(0, 256, (64, RECORD_BYTES), dtype=torch.uint8, generator=gen)
    for k, s in enumerate(SCALES):
        recs[k, :256] = torch.arange(256, dtype=torch.uint8)
        recs[k, 256:512] = torch.arange(256, dtype=torch.uint8)
        recs[k, 512:528] = torch.tensor(list(struct.pack("<f", s)) * 4, dtype=torch.uint8)
    assert same_bits(dequant_records(recs.cuda()), dequant_records(recs))


def test_encode_and_write_match_cpu() -> None:
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float16):
        raw = torch.randint(0, 2**16, (16, 512), generator=gen, dtype=torch.int32).to(torch.int16)
        normal = torch.randn(16, 512, generator=gen) * torch.exp2(
            torch.randint(-30, 30, (16, 1), generator=gen).float()
        )
        kv = torch.where(torch.arange(16).unsqueeze(1) % 2 == 0, raw.view(dtype).float(), normal).to(dtype)
        pe = torch.randn(16, 64, generator=gen).to(dtype)
        assert same_bits(encode_rows(kv_c=kv.cuda(), k_pe=pe.cuda()), encode_rows(kv_c=kv, k_pe=pe))
        cache = torch.randint(0, 256, (3, 4, RECORD_BYTES), dtype=torch.uint8, generator=gen)
        slots = torch.randint(-1, 12, (16,), generator=gen)
        a = write_records(kv_c=kv.cuda(), k_pe=pe.cuda(), kv_cache=cache.cuda(), slot_mapping=slots.cuda())
        assert same_bits(a, write_records(kv_c=kv, k_pe=pe, kv_cache=cache, slot_mapping=slots))


def test_convert_matches_cpu() -> None:
    gen = torch.Generator().manual_seed(2)
    kw = dict(
        req_id=torch.randint(-1, 5, (32,), generator=gen).to(torch.int32),
        block_table=torch.randint(-(2**31), 2**31 - 1, (4, 6), generator=gen).to(torch.int32),
        token_indices=torch.randint(-4, 400, (32, 256), generator=gen).to(torch.int32),
        block_size=64,
        has_prefill_workspace=True,
        prefill_workspace_request_ids=torch.randint(-1, 4, (32,), generator=gen).to(torch.int32),
        prefill_workspace_starts=torch.randint(0, 2**31 - 1, (3,), generator=gen).to(torch.int32),
    )
    cpu = convert(**kw)
    gpu = convert(**{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert same_bits(gpu[0], cpu[0]) and same_bits(gpu[1], cpu[1])


def test_gather_matches_cpu() -> None:
    gen = torch.Generator().manual_seed(3)
    cache = torch.randint(0, 256, (8, 3, RECORD_BYTES), dtype=torch.uint8, generator=gen)
    kw = dict(
        block_table=torch.randint(0, 8, (3, 5), generator=gen).to(torch.int32),
        workspace_starts=torch.tensor([0, 4, 4, 9], dtype=torch.int32),
        batch_size=3,
        seq_starts=torch.tensor([2, 0, 5], dtype=torch.int32),
        total=10,
    )
    cpu = gather(src_cache=cache, **kw)
    gpu = gather(src_cache=cache.cuda(), **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert same_bits(gpu, cpu)
