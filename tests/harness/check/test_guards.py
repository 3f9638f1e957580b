"""Guard zones and the write map, as their findings word them."""

from __future__ import annotations

import torch

from mlafuzz.harness.memory.guards import GUARD_BYTES, guarded_empty, never_written, oob_findings
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
