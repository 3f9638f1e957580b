"""SPEC 9.4's oracles: hand-worked mappings, and the loop and vectorized versions agreeing."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.generators.draw import SMALL
from mlafuzz.harness.ops.table import OPS
from mlafuzz.oracles import dcp as od

I32 = torch.int32


def _t(rows):
    return torch.tensor(rows, dtype=I32)


def test_a_rank_keeps_its_own_tokens_as_local_slots_and_packs_them_to_the_front():
    # D=2, I=1: odd tokens are rank 1's, token 2j+1 its local j; bs=2, the rank's table [5, 9].
    args = dict(req_id=_t([0]), block_table=_t([[5, 9]]), token_indices=_t([[0, 1, 2, 3, -1, 5]]), block_size=2)
    out, counts = od.dcp_filter(**args, dcp_size=2, dcp_rank=1, interleave=1, compact=False)
    assert out.tolist() == [[-1, 10, -1, 11, -1, 18]] and counts.tolist() == [3]
    packed, _ = od.dcp_filter(**args, dcp_size=2, dcp_rank=1, interleave=1, compact=True)
    assert packed.tolist() == [[10, 11, 18, -1, -1, -1]]


def test_the_interleave_deals_groups_of_tokens_to_the_ranks():
    # D=2, I=2: tokens 0,1 -> rank 0 (local 0,1), 2,3 -> rank 1 (local 0,1), 4,5 -> rank 0 (local 2,3).
    assert [od.owner_local(t, dcp_size=2, interleave=2) for t in range(6)] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3),
    ]  # fmt: skip


def test_peer_slots_are_rank_major_and_drop_blocks_outside_the_peer_or_the_table():
    # D=2, I=2, bs=4, 16 blocks per peer, request 0's table [3, 7, 9]: token 0 -> owner 0, block 3;
    # token 2 -> owner 1, block 3 of its cache = block 19 of the view; token 8 -> owner 0, local 4.
    out, counts = od.dcp_peer_slots(
        req_id=_t([0]), block_table=_t([[3, 7, 9]]), token_indices=_t([[0, 2, 8, -1]]), block_size=4,
        dcp_size=2, interleave=2, blocks_per_peer=16,
    )  # fmt: skip
    assert out.tolist() == [[12, 76, 28, -1]] and counts.tolist() == [3]
    # D=1, bs=2, 8 blocks per peer: a -1, a block past the table, a block id past the peer, a request
    # past the table, a negative request (the cases of vLLM's own test of the peer map).
    out, counts = od.dcp_peer_slots(
        req_id=_t([0, 1, 2, -1]), block_table=_t([[2, -1], [3, 8]]),
        token_indices=_t([[-1, 8], [0, 2], [0, 1], [0, 1]]), block_size=2, dcp_size=1, interleave=1,
        blocks_per_peer=8,
    )  # fmt: skip
    assert out.tolist() == [[-1, -1], [6, -1], [-1, -1], [-1, -1]] and counts.tolist() == [0, 1, 0, 0]


@pytest.mark.parametrize("op", ["dcp", "dcp_peer"])
def test_the_loop_and_vectorized_oracles_agree_bit_for_bit_on_drawn_cases(op):
    row = OPS.get(op)
    for seed in range(40):
        case = OPS.materialize(OPS.draw_spec(op, seed=seed, knobs=SMALL), seed, "cpu")
        fast, slow = row.oracle(case), row.oracle_slow(case)
        assert fast.keys() == slow.keys()
        for name in fast:
            assert torch.equal(fast[name], slow[name]), (op, seed, name)


def hostile_inputs(seed: int) -> dict:
    """Inputs past what the generator draws: requests outside the table (negative too), table
    entries negative or past any peer, tokens negative or past the table, tables of no rows or
    columns; the layout within vLLM's host checks (the interleave divides the block size)."""
    g = torch.Generator().manual_seed(seed)

    def ints(lo: int, hi: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, dtype=I32)

    d, i = (int(v) for v in ints(1, 5, (2,)))
    bs = i * int(ints(1, 4, ()))
    r, m, n, k = int(ints(0, 4, ())), int(ints(0, 4, ())), int(ints(1, 5, ())), int(ints(1, 9, ()))
    peer = int(ints(1, 12, ()))
    table, tokens = ints(-3, peer + 3, (r, m + 2)), ints(-3, d * bs * (m + 2), (n, k))
    if seed % 3 == 0:  # the int32 extremes, where arithmetic in int32 would wrap
        every_third = table.view(-1)[::3]
        every_third.copy_(torch.tensor([-(2**31), 2**31 - 1], dtype=I32)[torch.arange(every_third.numel()) % 2])
        tokens[:, -1] = 2**31 - 1 - int(ints(0, 2 * d * bs, ()))
    return {
        "req_id": ints(-2, r + 2, (n,)),
        "block_table": table[:, :m],  # a column slice, as a rank's share is
        "token_indices": tokens,
        "block_size": bs,
        "dcp_size": d,
        "interleave": i,
        "blocks_per_peer": peer,
    }


@pytest.mark.parametrize(
    "compact, device", [(False, "cpu"), (True, "cpu"), pytest.param(True, "cuda", marks=pytest.mark.gpu)]
)
def test_the_vectorized_oracles_are_the_loop_ones_on_inputs_the_generator_never_draws(compact, device):
    for seed in range(300):
        a = hostile_inputs(seed)
        on = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in a.items()}
        fast, slow = od.dcp_peer_slots(**on), od.dcp_peer_slots_loop(**a)
        assert all(torch.equal(f.cpu(), s) for f, s in zip(fast, slow)), seed
        f = {**a, "dcp_rank": seed % a["dcp_size"], "compact": compact}
        del f["blocks_per_peer"]
        fast, slow = od.dcp_filter(**{k: on.get(k, v) for k, v in f.items()}), od.dcp_filter_loop(**f)
        assert all(torch.equal(x.cpu(), y) for x, y in zip(fast, slow)), seed


def test_at_d1_the_filter_keeps_an_uncounted_row_in_place_whatever_compact_valid_to_front_says():
    # vLLM hands D == 1 to the plain convert and drops compact_valid_to_front (every release).
    for counted_rule in ("in_place", "compact"):
        assert not od.filter_compacts(
            dcp_size=1, compact_valid_to_front=True, return_valid_counts=False, convert_counted=counted_rule
        )
    # A counted row is the plain convert's: packed only under convert_counted = compact (vLLM 0.30.0 on).
    assert not od.filter_compacts(
        dcp_size=1, compact_valid_to_front=True, return_valid_counts=True, convert_counted="in_place"
    )
    assert od.filter_compacts(
        dcp_size=1, compact_valid_to_front=False, return_valid_counts=True, convert_counted="compact"
    )
    # D > 1: the caller's flag, counted or not.
    for counted in (False, True):
        assert od.filter_compacts(
            dcp_size=2, compact_valid_to_front=True, return_valid_counts=counted, convert_counted="in_place"
        )
        assert not od.filter_compacts(
            dcp_size=3, compact_valid_to_front=False, return_valid_counts=counted, convert_counted="compact"
        )


def test_the_filters_block_stride_multiplies_the_table_entry_and_keeps_the_in_block_offset():
    # D=2, I=1, bs=2, stride 5: rank 1's token 3 is local 1 (block 0, offset 1) -> 7 * 5 + 1.
    args = dict(req_id=_t([0]), block_table=_t([[7, 9]]), token_indices=_t([[3, 5, 2, 9]]), block_size=2)
    for fn in (od.dcp_filter, od.dcp_filter_loop):
        out, counts = fn(**args, dcp_size=2, dcp_rank=1, interleave=1, compact=False, block_stride=5)
        # token 5 -> local 2: block 1, offset 0 -> 45; token 9 -> local 4: block 2, past the table.
        assert out.tolist() == [[36, 45, -1, -1]] and counts.tolist() == [2]
