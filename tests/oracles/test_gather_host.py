"""The gather oracle's host tier (SPEC 9.3): its loop and vectorized versions agree on drawn
host-tier cases, each slot reads the tier its maps name, and the host-tier preconditions are named."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.generators.draw import draw_with_seed
from mlafuzz.generators.ops import gather as gen
from mlafuzz.oracles import gather as og
from mlafuzz.oracles.codec import dequant_records

HOST_SEEDS = [s for s in range(200) if draw_with_seed(gen.draw, seed=s).host is not None][:24]


def _kwargs(case) -> dict:
    t = case.tensors
    return dict(
        src_cache=t["src_cache"],
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
        total=case.params["total"],
        host_cache=t["host_cache"],
        host_row_ids=t["host_row_ids"],
        device_row_ids=t["device_row_ids"],
    )


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_drawn_cases_cover_every_host_tier_feature():
    feats = set().union(*(gen.features(draw_with_seed(gen.draw, seed=s)) for s in HOST_SEEDS))
    assert {"host:mixed", "host:all", "host:none", "host:remap", "host:chunk-call"} <= feats


@pytest.mark.parametrize("seed", HOST_SEEDS)
def test_loop_and_vectorized_oracles_agree_on_host_tier_cases(seed):
    case = gen.materialize(draw_with_seed(gen.draw, seed=seed), seed=seed, device="cpu")
    kw = _kwargs(case)
    assert _bits_equal(og.gather(**kw), og.gather_loop(**kw))


def _tiny() -> dict:
    """bs 2, two device blocks (4 slots) of distinct records, a 3-row host cache of others."""
    records = torch.randint(0, 120, (7, 656), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    records[:, 512:528] = torch.tensor([1.0, 2.0, 0.5, 4.0]).repeat(7, 1).view(torch.uint8)
    return dict(
        src_cache=records[:4].clone().view(2, 2, 656),
        block_table=torch.tensor([[1, 0]], dtype=torch.int32),  # positions 0..3 -> slots 2, 3, 0, 1
        workspace_starts=torch.tensor([0], dtype=torch.int32),
        batch_size=1,
        seq_starts=None,
        total=4,
        host_cache=records[4:].clone(),
        # slot:            0   1            2   3
        host_row_ids=torch.tensor([0, 1, -1, 2], dtype=torch.int32),
        device_row_ids=torch.tensor([-1, 0, 3, -(2**31)], dtype=torch.int32),
        records=records,
    )


@pytest.mark.parametrize("fn", [og.gather, og.gather_loop], ids=["vectorized", "loop"])
def test_each_slot_reads_the_tier_its_maps_name(fn):
    kw = _tiny()
    records = kw.pop("records")
    host = kw["host_cache"]
    # position 0 -> slot 2: device row 3 (a -1 host row on a device slot is never read);
    # position 1 -> slot 3: INT_MIN is negative, so host row 2; position 2 -> slot 0: -1, host row 0;
    # position 3 -> slot 1: device row 0 is a row like any other.
    expected = torch.stack([records[3], host[2], host[0], records[0]])
    assert _bits_equal(fn(**kw), dequant_records(expected))


@pytest.mark.parametrize(
    ("change", "klass"),
    [
        ({"host_row_ids": torch.tensor([-1, 1, -1, 2], dtype=torch.int32)}, "host_row_past_cache"),
        ({"host_row_ids": torch.tensor([0, 1, -1, 3], dtype=torch.int32)}, "host_row_past_cache"),
        ({"device_row_ids": torch.tensor([-1, 0, 4, -1], dtype=torch.int32)}, "device_row_past_cache"),
        (
            {
                "host_row_ids": torch.tensor([0, 1, -1], dtype=torch.int32),
                "device_row_ids": torch.tensor([-1, 0, 3], dtype=torch.int32),
            },
            "slot_past_row_map",
        ),
    ],
)
def test_host_tier_preconditions_are_named(change, klass):
    kw = _tiny()
    kw.pop("records")
    kw.update(change)
    assert og.gather_preconditions(**kw) == [klass]
    with pytest.raises(ValueError, match=klass):
        og.gather(**kw)


def test_host_arguments_given_in_part_are_an_argument_error():
    kw = _tiny()
    kw.pop("records")
    kw["device_row_ids"] = None
    with pytest.raises(ValueError, match="together"):
        og.gather_preconditions(**kw)
