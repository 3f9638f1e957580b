"""The writer contract revisions our implementations know how to follow (SPEC.md section 7).

An implementation under test never reads the references (kernels may not import
oracles), so it carries its own list of the revisions it implements; a test
holds this list to ``mlafuzz.oracles.writer_scale.REVISIONS``. The names are
the SPEC's: ``2026-07`` is section 2 as written (scale = max(amax / 448,
FLT_MIN)), ``2026-09`` the power-of-two scale of vLLM PR #49435.
"""

from __future__ import annotations

__all__ = ["WRITER_REVISIONS", "NEWEST", "POW2_SCALE", "check_revision", "scale_rule"]

WRITER_REVISIONS: tuple[str, ...] = ("2026-07", "2026-09")
NEWEST: str = WRITER_REVISIONS[-1]
# Revisions whose tile scale is rounded up to a power of two (with the 1e-4f floor).
POW2_SCALE: frozenset[str] = frozenset({"2026-09"})


def check_revision(revision: object) -> str:
    """``revision`` if our writers implement it; else ValueError naming the ones they do."""
    if revision not in WRITER_REVISIONS:
        raise ValueError(f"revision={revision!r}: our writers implement {', '.join(WRITER_REVISIONS)}")
    return revision  # type: ignore[return-value]


def scale_rule(revision: str) -> int:
    """The CUDA writer kernels' ``scale_rule`` for ``revision``: 0 is SPEC section 2 as written,
    1 the power-of-two scale with the 1e-4f floor (an int, so a later rule is one more)."""
    return 1 if check_revision(revision) in POW2_SCALE else 0
