"""The DCP peer map's drawn blocks_per_peer: an uncut case's bound (known on the host, no read of
the table) is above every block id the call sees, a cut case's is half its rank's largest."""

from __future__ import annotations

from mlafuzz.generators.draw import SMALL, Knobs
from mlafuzz.harness.ops.table import OPS
from tests.support.syncs import counting


def test_an_uncut_peer_case_makes_every_block_id_valid_without_reading_the_table():
    seen = {False: 0, True: 0}
    for knobs in (SMALL, Knobs()):
        for seed in range(60):
            spec = OPS.draw_spec("dcp_peer", seed=seed, knobs=knobs)
            with counting() as count:
                case = OPS.materialize(spec, seed, "cpu")
            reads = count.sites.total() - sum(n for site, n in count.sites.items() if "generators/rng/" in site)
            table, bound = case.tensors["block_table"], case.params["blocks_per_peer"]
            # The table's view and the rows around it too: a read past the view meets a valid id.
            base = table._base if table._base is not None else table
            top = int(table.max()) + 1 if table.numel() else 1
            if spec.cut:
                assert bound == max(1, (top + 1) // 2) and reads == 1, (seed, bound, top, reads)
            else:
                assert int(base.max()) < bound and reads == 0, (seed, bound, top, reads)
            seen[spec.cut] += 1
    assert seen[False] and seen[True]
