"""Guard zones and the write map, as their findings word them."""

from __future__ import annotations

import torch

from mlafuzz.harness.memory.guards import GUARD_BYTES, guarded_empty, guarded_set, never_written, oob_findings
from mlafuzz.reports.findings import Context


def test_a_byte_written_just_past_the_end_is_said_in_words_that_add_up():
    g = guarded_empty(shape=(2, 4), dtype=torch.bfloat16, device="cpu", fill=0xA5)
    g.full[GUARD_BYTES + g.nbytes] = 0  # the first byte after the output
    g.full[GUARD_BYTES - 3] = 0  # the third byte before it
    (f,) = oob_findings(name="dst", g=g, ctx=Context(op="gather", impl="x", case_id="c"))
    assert f.cause == "dst:oob_both" and f.count == 2
    assert "1 byte before it (the nearest at byte -3 from its start)" in f.message
    assert "1 byte after it (the first at byte +0 from its end)" in f.message


def test_never_written_marks_each_element_with_a_byte_left_at_both_fills():
    a = guarded_empty(shape=(2, 4), dtype=torch.bfloat16, device="cpu", fill=0xA5)
    b = guarded_empty(shape=(2, 4), dtype=torch.bfloat16, device="cpu", fill=0x5A)
    for g in (a, b):
        g.view[0].zero_()  # row 0 written in both runs, row 1 never
        g.view.view(torch.int16)[1, 0] = 0  # but element [1, 0] was written too
    mask = never_written(a, b)
    assert mask.tolist() == [False] * 5 + [True] * 3
    for g in (a, b):
        g.view.zero_()
    assert never_written(a, b) is None


def test_outputs_guarded_together_each_keep_their_own_zones_aligned_and_filled():
    """One buffer, one fill, for a call's outputs (convert's out and valid_counts): each output's
    bytes 16-byte aligned and filled, its zones (and workspace rows) its own, so a write past one
    output is that output's OOB_WRITE alone and the other's zones stay whole."""
    gs = guarded_set(shapes={"out": (3, 5), "counts": (3,)}, dtype=torch.int32, device="cpu", fill=0xA5, rows_after=2)
    assert gs["out"].full.data_ptr() == gs["counts"].full.data_ptr() - gs["out"].full.numel()  # one buffer
    ctx = Context(op="convert", impl="x", case_id="c")
    for name, g in gs.items():
        assert g.view.data_ptr() % 16 == 0 and g.view.is_contiguous()
        assert bool((g.full == 0xA5).all()) and g.region().data_ptr() == g.view.data_ptr()
        assert not oob_findings(name=name, g=g, ctx=ctx)
    shapes = [tuple(g.view.shape) for g in gs.values()]
    assert shapes == [(3, 5), (3,)]
    gs["out"].view.zero_()
    gs["counts"].view.zero_()
    gs["out"].full[gs["out"].start + gs["out"].nbytes] = 0  # the workspace row right after out
    (f,) = oob_findings(name="out", g=gs["out"], ctx=ctx)
    assert f.cause == "out:oob_after" and f.count == 1
    assert not oob_findings(name="counts", g=gs["counts"], ctx=ctx)
