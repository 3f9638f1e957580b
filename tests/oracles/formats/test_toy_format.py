"""Adding a cache format takes its table row, its codec and its oracle (issue 39 item 1).

A toy format, ``toy8`` (32 int8 NoPE codes, one float32 scale for the whole row, 4 bf16 RoPE
values: 44-byte records), is written here the way a real one is: its row (what
oracles/formats/table.py would hold), its codec's bit width (a ``CODEC_BITS`` entry), its codec
(encode / decode, reading every offset from the row), and its gather oracle. Then the generic
pieces take it with no other change:

- the format table: the row is validated like the real ones (planes tile the record, codec widths
  match byte counts, scales cover the NoPE values), and found by name and by record size, which is
  how FlashMLA tells formats apart and how a bundle's cache names its format;
- the gather addressing: ``oracles.formats.addressing`` (which record each dst row reads, which
  preconditions a call breaks; fp8_ds_mla's and nvfp4_ds_mla's gathers use it) names no format, and the fused
  check's offsets kernel (``harness.fast.gather.record_offsets``) strides by the cache's record
  size, so a 44-byte record is addressed as a 656-byte one is.

What "nothing else" does not cover, honestly: an op on a new format (its generator, its
implementations and mutants, its fast check) is an op of its own, added as the toy op is
(tests/harness/cli/test_toy_op.py); fp8_ds_mla's generators and fused checks are specialized to
its codec (tile scales, e4m3fn), reading only its sizes and offsets from its row.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest
import torch
from torch import Tensor

from mlafuzz.oracles.formats import addressing as og
from mlafuzz.oracles.formats import table
from mlafuzz.oracles.formats.table import Format, Plane

BS = 4  # records per block


def _toy_row() -> Format:
    return Format(
        name="toy8",
        record_bytes=44,
        planes=(
            Plane(name="nope", offset=0, nbytes=32, elements=32, codec="i8"),
            Plane(name="scale", offset=32, nbytes=4, elements=1, codec="f32_le"),
            Plane(name="rope", offset=36, nbytes=8, elements=4, codec="bf16_bits"),
        ),
        scale_block=32,
        scale_slots=(0,),
        row_dim=36,
        align=4,  # 44 = 11 x 4
        source="tests/oracles/formats/test_toy_format.py",
    )


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Format:
    """The toy's codec width and row, added to the table for this test only."""
    monkeypatch.setattr(table, "CODEC_BITS", MappingProxyType({**table.CODEC_BITS, "i8": 8}))
    row = _toy_row()
    monkeypatch.setattr(table, "FORMATS", MappingProxyType({**table.FORMATS, row.name: row}))
    return row


# --- the toy's codec (oracles/formats/toy8_record.py) -----------------------------------------
def encode(fmt: Format, nope: Tensor, rope: Tensor) -> Tensor:
    """float32 [n, nope_dim], bf16 [n, rope_dim] -> uint8 [n, record_bytes]: int8 codes of
    x / scale, scale = amax / 127 (1 for an all-zero row), RoPE bits copied."""
    n = nope.shape[0]
    scale = (nope.abs().amax(dim=1) / 127).where(nope.abs().amax(dim=1) > 0, torch.ones(n))
    codes = torch.round(nope / scale[:, None]).to(torch.int8)
    out = torch.zeros((n, fmt.record_bytes), dtype=torch.uint8)
    for name, raw in (("nope", codes), ("scale", scale.float()), ("rope", rope)):
        plane = fmt.plane(name)
        out[:, plane.offset : plane.stop] = raw.contiguous().view(torch.uint8).reshape(n, plane.nbytes)
    return out


def decode(fmt: Format, records: Tensor) -> Tensor:
    """uint8 [n, record_bytes] -> bf16 [n, row_dim]: code x scale, then the RoPE bits."""
    part = {name: records[:, fmt.plane(name).offset : fmt.plane(name).stop].contiguous() for name in table.PLANE_NAMES}
    nope = part["nope"].view(torch.int8).float() * part["scale"].view(torch.float32)
    return torch.cat([nope.to(torch.bfloat16), part["rope"].view(torch.bfloat16)], dim=1)


# --- the toy's gather oracle (oracles/formats/toy8_gather.py) ---------------------------------
def gather(fmt: Format, *, src_cache: Tensor, block_table: Tensor, workspace_starts: Tensor, total: int) -> Tensor:
    """dst bf16 [total, row_dim]: row i is the record the generic addressing names, decoded."""
    batch_size = workspace_starts.numel()
    block, entry = og.row_records(
        block_size=src_cache.shape[1],
        block_table=block_table,
        workspace_starts=workspace_starts,
        batch_size=batch_size,
        seq_starts=None,
        total=total,
        device=src_cache.device,
    )
    return decode(fmt, src_cache[block, entry])


def _toy_cache(fmt: Format, blocks: int) -> tuple[Tensor, Tensor]:
    """A paged toy cache [blocks, BS, 44] and the decoded row of every slot, [blocks * BS, 36]."""
    g = torch.Generator().manual_seed(39)
    nope = torch.randn((blocks * BS, fmt.nope_dim), generator=g) * 10
    rope = torch.randn((blocks * BS, fmt.rope_dim), generator=g).to(torch.bfloat16)
    records = encode(fmt, nope, rope)
    return records.reshape(blocks, BS, fmt.record_bytes), decode(fmt, records)


def test_a_new_row_is_found_by_name_and_by_record_size_beside_the_real_ones(toy: Format) -> None:
    assert table.names() == ("fp8_ds_mla", "nvfp4_ds_mla", "toy8")
    assert table.get("toy8") is toy
    assert table.by_record_bytes(44) is toy
    assert table.by_record_bytes(656).name == "fp8_ds_mla"
    assert table.by_record_bytes(352).name == "nvfp4_ds_mla"
    with pytest.raises(ValueError, match="toy8"):
        table.get("toy9")  # the error lists the new format among the choices


def test_a_new_row_is_checked_as_the_real_ones_are(toy: Format) -> None:
    with pytest.raises(ValueError, match="must tile"):
        dataclasses.replace(toy, record_bytes=48)  # 4 bytes no plane holds
    with pytest.raises(ValueError, match="holds 16 x i8 in 32 bytes"):
        dataclasses.replace(toy, planes=(dataclasses.replace(toy.planes[0], elements=16), *toy.planes[1:]))
    with pytest.raises(ValueError, match="row_dim"):
        dataclasses.replace(toy, row_dim=35)


def test_a_row_whose_codec_is_not_registered_is_refused() -> None:
    with pytest.raises(ValueError, match="holds 32 x i8 in 32 bytes"):
        _toy_row()  # without the fixture: the table knows no codec "i8"


def test_the_toy_gather_reads_the_rows_the_generic_addressing_names(toy: Format) -> None:
    cache, rows = _toy_cache(toy, blocks=6)
    # Two requests of 5 and 7 tokens in shuffled blocks: request b's token p is in block
    # table[b][p // BS], entry p % BS.
    table_ = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32)
    ws = torch.tensor([0, 5], dtype=torch.int32)
    got = gather(toy, src_cache=cache, block_table=table_, workspace_starts=ws, total=12)
    want = [rows[int(table_[b, p // BS]) * BS + p % BS] for b, n in ((0, 5), (1, 7)) for p in range(n)]
    assert torch.equal(got.view(torch.int16), torch.stack(want).view(torch.int16))
    # The same addressing's precondition check judges a toy call: block 6 is past a 6-block cache.
    assert og.addressing_violations(
        ws=[0, 5], seq_starts=[0, 0], table=[[4, 1], [0, 6]], block_size=BS, num_blocks=6, total=12
    ) == ["block_id_past_cache"]


def test_the_toy_oracle_reads_through_the_shared_checked_call(toy: Format) -> None:
    """``GatherCall`` (what both real gather oracles read through) takes the toy's 44-byte records
    as they are: its loop and vectorized addressing read the same records, a cache of another
    record size is refused naming 44, and a call past the cache defines nothing."""
    cache, _ = _toy_cache(toy, blocks=6)
    table_ = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32)
    ws = torch.tensor([0, 5], dtype=torch.int32)

    def call(src: Tensor, table: Tensor) -> og.GatherCall:
        return og.GatherCall(src, table, ws, 2, None, 12, as_records=lambda t: t, record_bytes=toy.record_bytes)

    records = call(cache, table_).require().records()
    assert torch.equal(records, call(cache, table_).records_loop())
    assert torch.equal(
        decode(toy, records).view(torch.int16),
        gather(toy, src_cache=cache, block_table=table_, workspace_starts=ws, total=12).view(torch.int16),
    )
    with pytest.raises(ValueError, match="expected \\[num_blocks, bs, 44\\]"):
        call(cache[..., :40], table_)
    with pytest.raises(ValueError, match="block_id_past_cache"):
        call(cache, torch.tensor([[4, 1], [0, 6]], dtype=torch.int32)).require()


def test_the_fused_checks_offsets_stride_by_the_toy_record(toy: Format) -> None:
    """The fused gather check's kernel addresses records by the cache's record size: a toy
    cache's rows are found at multiples of 44 bytes, the same records the oracle reads."""
    from mlafuzz.harness.fast.gather import record_offsets

    cache, rows = _toy_cache(toy, blocks=6)
    table_ = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32)
    ws = torch.tensor([0, 5], dtype=torch.int32)
    args = dict(block_table=table_, workspace_starts=ws, batch_size=2, seq_starts=None, total=12)
    offsets = record_offsets(src_cache=cache, **args)
    flat = cache.reshape(-1)
    records = torch.stack([flat[o : o + toy.record_bytes] for o in offsets.tolist()])
    oracle = gather(toy, src_cache=cache, block_table=table_, workspace_starts=ws, total=12)
    assert torch.equal(decode(toy, records).view(torch.int16), oracle.view(torch.int16))
    block, entry = og.row_records(block_size=BS, device=cache.device, **args)
    assert torch.equal(offsets, (block * BS + entry) * toy.record_bytes)
