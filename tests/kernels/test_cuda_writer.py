"""The CUDA fp8_ds_mla writer against the oracle: every written cache byte bit for bit (GPU)."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.kernels import cuda_ext
from mlafuzz.oracles import codec
from mlafuzz.oracles.writer_scale import NEWEST, REVISIONS
from mlafuzz.tests.support.cuda_cases import (
    DEV,
    _oracle_gather,
    _sync,
    assert_rows_equal,
    explicit_case,
    ext,  # noqa: F401  (a fixture)
    gpu,
    kv_inputs,
    place_cache,
    root_bytes,
)

# ----------------------------------------------------------------------------- GPU: writer

# Our CUDA writer follows either contract revision (SPEC section 7), the newest by default.
REVISION = NEWEST


def _check_cache_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    a = actual.reshape(-1, 656).cpu()
    e = expected.reshape(-1, 656).cpu()
    bad = a != e
    if bad.any():
        rows, cols = bad.nonzero(as_tuple=True)
        part = lambda c: "code" if c < 512 else ("scale" if c < 528 else "rope")  # noqa: E731
        first = "; ".join(
            f"slot {int(r)} byte {int(c)} ({part(int(c))}) got {int(a[r, c]):#04x} want {int(e[r, c]):#04x}"
            for r, c in list(zip(rows, cols))[:8]
        )
        pytest.fail(f"{what}: {int(bad.sum())} bytes differ in {len(set(rows.tolist()))} slots; {first}")


WRITER_CASES = [
    dict(
        seed=s,
        bs=(1, 16, 64)[s % 3],
        kv_dtype=d[0],
        pe_dtype=d[1],
        cache_layout=("contig", "fp8", "offset1", "offset8", "entry_pad4", "block_pad")[s % 6],
        fused=bool(s % 2) and d[0] == d[1],
    )
    for s, d in enumerate(
        [(torch.bfloat16, torch.bfloat16)] * 6
        + [(torch.float16, torch.float16)] * 4
        + [(torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)]
    )
]


@gpu
@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("p", WRITER_CASES, ids=lambda p: f"s{p['seed']}-bs{p['bs']}-{p['cache_layout']}")
def test_writer_random_vs_oracle(ext, p, revision):
    """Special values per tile (NaN, all-NaN, +-inf, huge, subnormal, zeros, random bits, RNE ties),
    slot -1 padding, extra kv_c rows, fused (strided) kv_c/k_pe: the whole cache must equal
    codec.write_records under the same contract revision byte for byte, untouched slots included."""
    gen = torch.Generator().manual_seed(p["seed"])
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=p["bs"], kv_dtype=p["kv_dtype"], pe_dtype=p["pe_dtype"])
    expected = codec.write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots, revision=revision)
    dev = DEV
    dev_cache = place_cache(cache, p["cache_layout"], dev)
    kv_c_d, k_pe_d, slots_d = kv_c.to(dev), k_pe.to(dev), slots.to(dev)
    if p["fused"]:  # views of one [T, 576 + 8] tensor, as vLLM slices one projection output
        both = torch.cat([kv_c, k_pe, torch.zeros(kv_c.shape[0], 8, dtype=kv_c.dtype)], 1).to(dev)
        kv_c_d, k_pe_d = both[:, :512], both[:, 512:576]
    inputs_before = [kv_c_d.clone(), k_pe_d.clone(), slots_d.clone()]
    cuda_ext.writer(kv_c_d, k_pe_d, dev_cache, slots_d, "fp8_ds_mla", None, revision=revision)
    _sync()
    _check_cache_equal(dev_cache.view(torch.uint8), expected, f"writer {p}")
    # Whole underlying buffer (padding between records included) == the expected cache placed
    # the same way: nothing written outside the records.
    assert torch.equal(root_bytes(dev_cache), root_bytes(place_cache(expected, p["cache_layout"], dev))), (
        "writer wrote outside the records (layout padding changed)"
    )
    for b, a in zip(inputs_before, (kv_c_d, k_pe_d, slots_d)):  # bitwise: inputs hold NaNs
        assert torch.equal(
            b.view(torch.int16 if b.element_size() == 2 else b.dtype),
            a.view(torch.int16 if a.element_size() == 2 else a.dtype),
        ), "writer modified an input"


@gpu
def test_writer_convert_fp16_rope_option(ext):
    gen = torch.Generator().manual_seed(5)
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=16, kv_dtype=torch.float16, pe_dtype=torch.float16)
    k_pe[:, :8] = torch.tensor(
        [float("nan"), float("inf"), -float("inf"), 6e-8, 1 + 2**-8, 1 + 3 * 2**-9, 65504.0, -0.0], dtype=torch.float16
    )  # NaN, inf, subnormal, RNE ties
    expected = codec.write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots, revision=REVISION)
    rope = k_pe[: slots.numel()].float().to(torch.bfloat16).view(torch.int16)
    rope = torch.where(torch.isnan(k_pe[: slots.numel()]), torch.full_like(rope, 0x7FC0), rope)
    flat = expected.view(-1, 656)
    valid = slots >= 0
    flat[slots[valid], 528:] = rope[valid].contiguous().view(torch.uint8).view(-1, 128)
    dev_cache = cache.to(DEV)
    cuda_ext.writer_impl(kv_c.to(DEV), k_pe.to(DEV), dev_cache, slots.to(DEV), convert_fp16_rope=True)
    _check_cache_equal(dev_cache, expected, "writer convert_fp16_rope")


@gpu
def test_writer_no_valid_slots_and_empty(ext):
    gen = torch.Generator().manual_seed(9)
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=16, kv_dtype=torch.bfloat16, pe_dtype=torch.bfloat16)
    dev_cache = cache.to(DEV)
    cuda_ext.writer(kv_c.to(DEV), k_pe.to(DEV), dev_cache, torch.full_like(slots, -1).to(DEV))
    cuda_ext.writer(kv_c[:0].to(DEV), k_pe[:0].to(DEV), dev_cache, slots[:0].to(DEV))
    _check_cache_equal(dev_cache, cache, "writer with only padding tokens")


@gpu
def test_writer_then_gather_roundtrip(ext):
    """Pipeline: our writer fills a cache, our gather reads it back == oracle gather of the
    oracle-written cache."""
    gen = torch.Generator().manual_seed(11)
    kv_c, k_pe, slots, cache = kv_inputs(gen, bs=16, kv_dtype=torch.bfloat16, pe_dtype=torch.bfloat16)
    expected_cache = codec.write_records(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots, revision=REVISION)
    dev_cache = cache.to(DEV)
    cuda_ext.writer(kv_c.to(DEV), k_pe.to(DEV), dev_cache, slots.to(DEV))
    nb, bs = cache.shape[:2]
    half = nb * bs // 2
    case = explicit_case(
        cache=expected_cache, lens=[half, nb * bs - half], seq_starts=[0, half], table=[list(range(nb))] * 2
    )
    expected = _oracle_gather(case)
    dst = torch.empty(case.total, 576, dtype=torch.bfloat16, device=DEV)
    cuda_ext.gather(dev_cache, dst, case.block_table.to(DEV), case.ws.to(DEV), 2, case.seq_starts.to(DEV))
    assert_rows_equal(dst.cpu(), expected, "writer -> gather roundtrip")


@gpu
@pytest.mark.parametrize(
    "bad", ["kv_f32", "kv_cols", "pe_cols", "slots_int32", "few_rows", "cache_657", "cache_cpu_slots"]
)
def test_writer_host_checks(ext, bad):
    dev = DEV
    kv_c = torch.zeros(4, 512, dtype=torch.bfloat16, device=dev)
    k_pe = torch.zeros(4, 64, dtype=torch.bfloat16, device=dev)
    cache = torch.full((2, 4, 656), 9, dtype=torch.uint8, device=dev)
    slots = torch.arange(4, dtype=torch.int64, device=dev)
    args = [kv_c, k_pe, cache, slots]
    if bad == "kv_f32":
        args[0] = kv_c.float()
    elif bad == "kv_cols":
        args[0] = kv_c[:, :511]
    elif bad == "pe_cols":
        args[1] = torch.zeros(4, 32, dtype=torch.bfloat16, device=dev)
    elif bad == "slots_int32":
        args[3] = slots.int()
    elif bad == "few_rows":
        args[0] = kv_c[:3]
    elif bad == "cache_657":
        args[2] = torch.zeros(2, 4, 657, dtype=torch.uint8, device=dev)
    elif bad == "cache_cpu_slots":
        args[3] = slots.cpu()
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        cuda_ext.writer(*args)
    _sync()
    assert bool((cache == 9).all()), "a rejected call wrote the cache"
