"""Exact e2m1 ties and the tie-aware comparison of nvfp4 records (SPEC.md section 11.3).

A quotient ``q = x / sf`` that lies exactly halfway between two neighbouring e2m1 magnitudes is
a tie: round-to-nearest-even takes the even code, but a writer whose quotient is off by an ulp
(``mul_recip``'s ``x * f32(1 / sf)``, Triton's approximate ``div.full.f32``) lands on the other
neighbour. The tie set is derived from the magnitude table: the midpoints of neighbouring
magnitudes, ``E2M1_TIES`` = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0). Of these, the ones the two
writer quotients actually split are fewer (``quotient_rule_disagreements``: 1.25, 2.5 and 5.0
with scales of mantissa 0b111, 42 positive (scale byte, bf16 value) pairs, 84 counting signs).

``compare_records`` judges a writer's records against the oracle's given the writer's input:
a NoPE code that differs only where the exact quotient ``|x| / e4m3(oracle's sf)`` is a tie and
is the other neighbour of that tie counts as a tie hit, apart from mismatches, so a writer can be
reported "bit-exact except ties". Where the scale bytes differ, the block's codes are judged
against nothing (the scale is the mismatch); RoPE bytes must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mlafuzz.oracles.formats.minifloat import E2M1_MAGNITUDES, e2m1_rn_satfinite, e4m3_decode
from mlafuzz.oracles.formats.nvfp4_record import FORMAT, unpack

__all__ = ["E2M1_TIES", "TieReport", "exact_ties", "compare_records", "quotient_rule_disagreements"]

#: The exact e2m1 ties: the midpoint of each pair of neighbouring magnitudes.
E2M1_TIES: tuple[float, ...] = tuple((a + b) / 2 for a, b in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:]))
_BLOCK = FORMAT.scale_block


def exact_ties(x: Tensor, sf: Tensor) -> Tensor:
    """bool, x's shape: where ``|x| / e4m3(sf)`` is exactly an e2m1 tie. ``x`` f32-exact values
    [..., 512] (bf16/fp16/f32), ``sf`` the scale bytes [..., 32] in element-block order. Tested as
    ``|x| == tie * s``: the product of a tie (at most 3 significant bits) and an e4m3 value (4)
    is exact in f32, so the comparison is exact where a division would round."""
    s = e4m3_decode(sf).repeat_interleave(_BLOCK, dim=-1).to(x.device)
    a = x.float().abs()
    hit = torch.zeros_like(a, dtype=torch.bool)
    for tie in E2M1_TIES:
        hit |= a == s * tie
    return hit & torch.isfinite(s) & (s > 0)


@dataclass(frozen=True, kw_only=True)
class TieReport:
    """The outcome of ``compare_records``: counts, and [n, 3] (token, kind, element) index rows of
    each class; kind 0 = NoPE code, 1 = scale (element = block), 2 = RoPE byte."""

    elements: int  # NoPE codes + scales + RoPE bytes compared
    mismatches: int
    tie_hits: int
    mismatch_at: Tensor
    tie_at: Tensor

    @property
    def bit_exact(self) -> bool:
        return self.mismatches == 0 and self.tie_hits == 0

    @property
    def exact_except_ties(self) -> bool:
        return self.mismatches == 0

    def summary(self) -> str:
        word = "bit-exact" if self.bit_exact else "bit-exact except ties" if self.exact_except_ties else "mismatched"
        return f"{word}: {self.mismatches} mismatches, {self.tie_hits} tie hits / {self.elements} elements"


def _where(mask: Tensor, kind: int) -> Tensor:
    idx = mask.nonzero()
    return torch.cat([idx[:, :1], torch.full_like(idx[:, :1], kind), idx[:, 1:]], dim=1)


def compare_records(*, kv_c: Tensor, expected: Tensor, actual: Tensor) -> TieReport:
    """Compare a writer's records ``actual`` [T, 352] with the oracle's ``expected`` [T, 352] for
    the writer input ``kv_c`` [T, 512] (the tokens in record order), tie-aware (module docstring)."""
    exp, act = unpack(expected), unpack(actual.to(expected.device))
    n = exp.codes.shape[0]
    x = kv_c[:n].to(expected.device).float()
    scale_bad = exp.scales != act.scales
    block_bad = scale_bad.repeat_interleave(_BLOCK, dim=-1)
    differ = (exp.codes != act.codes) & ~block_bad
    tie = exact_ties(x, exp.scales)
    # The other neighbour of a tie: round the tie to odd instead of even, i.e. the code a quotient
    # one ulp on the far side would take (same sign as x).
    q = x.abs() / e4m3_decode(exp.scales).repeat_interleave(_BLOCK, dim=-1)
    sign = torch.signbit(x).to(torch.uint8) << 3
    up = e2m1_rn_satfinite(torch.nextafter(q, torch.full_like(q, float("inf")))) | sign
    down = e2m1_rn_satfinite(torch.nextafter(q, torch.zeros_like(q))) | sign
    neighbour = tie & ((act.codes == up) | (act.codes == down))
    tie_hit = differ & neighbour
    code_bad = differ & ~neighbour
    rope_bad = exp.rope != act.rope.to(exp.rope.device)
    mismatch_at = torch.cat([_where(code_bad, 0), _where(scale_bad, 1), _where(rope_bad, 2)])
    elements = exp.codes.numel() + exp.scales.numel() + exp.rope.numel()
    return TieReport(
        elements=elements,
        mismatches=int(mismatch_at.shape[0]),
        tie_hits=int(tie_hit.sum()),
        mismatch_at=mismatch_at,
        tie_at=_where(tie_hit, 0),
    )


def quotient_rule_disagreements(*, device: torch.device | str = "cpu") -> list[tuple[int, float]]:
    """Every (scale byte, value) pair, over the positive finite scale bytes 0x01..0x7E and the
    positive finite bf16 values, where ``e2m1(x * f32(1 / sf))`` and ``e2m1(x / sf)`` differ:
    the pairs on which the ``mul_recip`` and ``div`` revisions write different codes (the
    negative values mirror them). Exhaustive: 126 x 32,639 quotients of each kind."""
    sf = torch.arange(1, 0x7F, dtype=torch.uint8, device=device)
    s = e4m3_decode(sf).unsqueeze(1)
    values = torch.arange(1, 0x7F80, dtype=torch.int32, device=device).to(torch.int16).view(torch.bfloat16).float()
    x = values.unsqueeze(0)
    div = e2m1_rn_satfinite(x / s)
    mul = e2m1_rn_satfinite(x * (torch.ones_like(s) / s))
    i, j = (div != mul).nonzero(as_tuple=True)
    return [(int(a), float(b)) for a, b in zip(sf[i].tolist(), values[j].tolist())]
