"""What our implementations make of the contract revisions (SPEC.md section 7), read off the rows
of ``mlafuzz.oracles.revisions``.

An implementation under test never reads the references (kernels may not import oracles); it
asks a revision's row for the rule it implements. Our writers implement the tile-scale rules of
``SCALE_RULES`` (its value is the CUDA kernels' ``scale_rule`` argument), so they follow every
revision whose ``writer_scale`` is one of them. The step pipeline asks for ``context_chunks``; our
converts ask for ``convert_counted`` (``COUNTED_RULES``: whether a counted row is compacted).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlafuzz.oracles import revisions

__all__ = [
    "ScaleRule",
    "SCALE_RULES",
    "WRITER_REVISIONS",
    "NEWEST",
    "check_revision",
    "scale_rule",
    "scale_of",
    "pow2_scale",
    "rule",
    "filter_compacts",
    "FILTER_REVISIONS",
    "COUNTED_RULES",
    "CONVERT_REVISIONS",
    "compacts_counted",
]


@dataclass(frozen=True)
class ScaleRule:
    """How our writers form a tile's scale under one ``writer_scale`` rule."""

    floor_bits: int  # the float32 bit pattern of the floor of amax / 448
    pow2: bool  # rounded up to a power of two after the floor
    cuda: int  # the CUDA writer kernels' ``scale_rule`` argument (a new rule is one more there too)


#: writer_scale rule -> how our writers follow it.
SCALE_RULES: dict[str, ScaleRule] = {
    "flt_min": ScaleRule(floor_bits=0x00800000, pow2=False, cuda=0),  # max(amax / 448, FLT_MIN)
    # max(amax / 448, 1e-4f) then 2**ceil; the floor by its bits, exactly the float32 of the C literal 1e-4f
    "pow2_1e-4": ScaleRule(floor_bits=0x38D1B717, pow2=True, cuda=1),
}

#: convert_counted rule -> whether our converts pack a counted row's valid slots into its front
#: (vLLM 0.30.0 on: ``COMPACT_TO_FRONT = return_valid_counts``) instead of leaving them in place.
COUNTED_RULES: dict[str, bool] = {"in_place": False, "compact": True}

NEWEST: str = revisions.newest()

#: The revisions our converts follow (those whose convert_counted rule they implement), oldest first.
CONVERT_REVISIONS: tuple[str, ...] = tuple(
    r.name for r in revisions.TABLE.rows if r.rule("convert_counted") in COUNTED_RULES
)


def _writer_revisions() -> tuple[str, ...]:
    return tuple(r.name for r in revisions.TABLE.rows if r.rule("writer_scale") in SCALE_RULES)


#: The revisions our writers follow (those whose scale rule they implement), oldest first.
WRITER_REVISIONS: tuple[str, ...] = _writer_revisions()


def rule(revision: object, name: str) -> str:
    """Rule ``name``'s value under ``revision`` (ValueError for an unknown revision)."""
    return revisions.get(revision).rule(name)


def check_revision(revision: object) -> str:
    """``revision`` if our writers implement its scale rule; else ValueError naming the ones they do."""
    try:
        value = rule(revision, "writer_scale")
    except ValueError:
        value = None
    if value not in SCALE_RULES:
        raise ValueError(f"revision={revision!r}: our writers implement {', '.join(_writer_revisions())}")
    return revision  # type: ignore[return-value]


def scale_of(revision: str) -> ScaleRule:
    """How our writers form the tile scale under ``revision`` (ValueError if they cannot)."""
    check_revision(revision)
    return SCALE_RULES[rule(revision, "writer_scale")]


def scale_rule(revision: str) -> int:
    """The CUDA writer kernels' ``scale_rule`` for ``revision``'s writer_scale rule."""
    return scale_of(revision).cuda


def pow2_scale(revision: str) -> bool:
    """Whether ``revision``'s tile scale is rounded up to a power of two."""
    return scale_of(revision).pow2


#: The revisions our DCP filters follow: every one (their D == 1 hand-off asks ``convert_counted``,
#: whose values they both implement).
FILTER_REVISIONS: tuple[str, ...] = revisions.names()


def filter_compacts(
    dcp_size: int, compact_valid_to_front: bool, return_valid_counts: bool, revision: str | None
) -> bool:
    """Whether our DCP filters pack their rows to the front: the caller's ``compact_valid_to_front``
    at D > 1; at D == 1 vLLM's function hands the call to its plain convert, which drops that flag
    (every release) and packs a counted row only where ``revision``'s ``convert_counted`` rule is
    ``compact`` (vLLM 0.30.0 on). ``revision`` None: the newest (read now: a test's table counts)."""
    if dcp_size == 1:
        return bool(return_valid_counts) and rule(revision or revisions.newest(), "convert_counted") == "compact"
    return bool(compact_valid_to_front)


def compacts_counted(revision: str | None) -> bool:
    """Whether our converts compact a counted row under ``revision``; None (a direct call that
    names no revision) is SPEC 3's call as written: in place."""
    return revision is not None and COUNTED_RULES[rule(revision, "convert_counted")]
