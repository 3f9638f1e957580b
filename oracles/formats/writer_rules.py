"""The nvfp4_ds_mla writer's revisions (SPEC.md section 11.3) as data: one row per rule pair.

Upstream has not settled how the writer rounds a tile's scale nor how it forms the quotient it
rounds to e2m1, so each combination is a named revision, in the style of ``oracles.revisions``:
code never compares revision names, it asks the row for a rule and dispatches on the value.

Rules and their values:

- ``scale_rounding``: ``rn_bump`` (round ``max(amax / 6, 2^-9)`` to the nearest e4m3, then take
  the next e4m3 up when that fell below the target and is not already 448: vLLM's CUDA writer
  @03b6016490 and FlashMLA's reference quant.py @29b0d03c) or ``rn`` (nearest, no bump: FlashMLA
  #21, "round the NVFP4 tile scale to nearest").
- ``quotient``: ``mul_recip`` (``x * f32(1 / sf)``, two f32 roundings: vLLM's CUDA writer) or
  ``div`` (``x / sf``, one correctly rounded f32 division: the references). They differ only
  where ``x / sf`` is exactly an e2m1 tie (``oracles.formats.nvfp4_ties``).

A revision's name is its rule pair, ``<scale_rounding>.<quotient>``; ``source`` says which
upstream code writes that way (one pair, ``rn.mul_recip``, has none yet: it is what vLLM's
writer becomes if it takes FlashMLA #21). Importable without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

__all__ = ["RULES", "WriterRevision", "REVISIONS", "DEFAULT", "get", "names"]

#: Every rule a writer revision sets, with the values it may take.
RULES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"scale_rounding": ("rn_bump", "rn"), "quotient": ("mul_recip", "div")}
)


@dataclass(frozen=True, kw_only=True)
class WriterRevision:
    """One writer revision: its name, every rule's value, and the upstream code that writes so."""

    name: str
    rules: Mapping[str, str]
    source: str

    def __post_init__(self) -> None:
        if set(self.rules) != set(RULES):
            raise ValueError(f"writer revision {self.name}: rules={sorted(self.rules)}, expected {sorted(RULES)}")
        for k, v in self.rules.items():
            if v not in RULES[k]:
                raise ValueError(f"writer revision {self.name}: {k}={v!r}, expected one of {', '.join(RULES[k])}")

    def rule(self, name: str) -> str:
        try:
            return self.rules[name]
        except KeyError:
            raise KeyError(f"rule {name!r} is not a writer rule (rules: {', '.join(RULES)})") from None


def _row(scale_rounding: str, quotient: str, source: str) -> WriterRevision:
    return WriterRevision(
        name=f"{scale_rounding}.{quotient}",
        rules=MappingProxyType({"scale_rounding": scale_rounding, "quotient": quotient}),
        source=source,
    )


#: The four writer revisions by name; vLLM's CUDA writer first.
REVISIONS: Mapping[str, WriterRevision] = MappingProxyType(
    {
        r.name: r
        for r in (
            _row("rn_bump", "mul_recip", "vLLM csrc/libtorch_stable/nvfp4_ds_mla_cache_kernels.cu @03b6016490"),
            _row("rn_bump", "div", "FlashMLA (vllm-project fork) tests/quant.py @29b0d03c"),
            _row("rn", "div", "FlashMLA #21 (round the NVFP4 tile scale to nearest), on its reference's division"),
            _row("rn", "mul_recip", "none yet: vLLM's CUDA quotient with FlashMLA #21's scale"),
        )
    }
)

#: What vLLM's own writer does: the revision an nvfp4 writer is held to unless it names another.
DEFAULT = "rn_bump.mul_recip"


def get(name: object) -> WriterRevision:
    """The row of writer revision ``name``; ValueError naming the revisions for an unknown one."""
    try:
        return REVISIONS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(f"writer revision={name!r}: expected one of {', '.join(REVISIONS)}") from None


def names() -> tuple[str, ...]:
    return tuple(REVISIONS)
