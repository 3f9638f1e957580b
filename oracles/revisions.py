"""The contract revisions (SPEC.md section 7 and 9.1) as data: one row each, the newest last.

A revision is a named set of rules. Each row says which upstream change made it,
where that change is (the PR and the source at a commit), and which rules it
changes against the revision before it; every other rule is inherited. Code
never compares revision names: it asks the row for the rule it implements
(``get(name).rule("writer_scale")``) and dispatches on the rule's value. A new
revision whose rule already has an implementation is one row here; a new value
of a rule is that row plus the rule's implementation (where the rule is
written: the oracle, and our implementations).

Rules and their values:

- ``writer_scale`` (SPEC 2, 7), the writer's per-tile scale: ``flt_min``
  (``max(amax / 448, FLT_MIN)``, stored as is) or ``pow2_1e-4`` (``max(amax /
  448, 1e-4f)`` rounded up to a power of two).
- ``context_chunks`` (SPEC 5.2, 9.1), how the step cuts the prefill contexts
  into workspace-sized chunks: ``equal_width`` (one width for every request,
  5.2) or ``packing_planner`` (the packing planner of 9.1).
- ``convert_counted`` (SPEC 10), where a convert row that is counted
  (``return_valid_counts=True``) keeps its valid slots: ``in_place`` (each in its
  own column, the -1s where the invalid columns were; vLLM up to 0.29) or
  ``compact`` (packed into columns ``[0, count)``, -1 after them, order unspecified
  across tiles; vLLM 0.30.0 launches the kernel with ``COMPACT_TO_FRONT =
  return_valid_counts``). An uncounted row is in place under both.

Revisions follow releases (SPEC 10). Each vLLM release on the package registry is a row of
the table's ``releases`` with the value of every rule as read from its wheel; the revision a release maps to
is the one row whose rules are the release's (``for_release``: ``--revision auto``). Where no
dated revision pairs a release's rules (vLLM 0.28-0.30 pair the packing planner with the FLT_MIN
writer), a row named after the release (``vllm-0.28``, ``vllm-0.30``) does.

Importable without torch (``mlafuzz --help`` lists the names) and by every
layer: it imports nothing, and it is the one module of the oracles that our kernels may read
(the no-borrowing import contract names the exemption: data, not reference code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

__all__ = [
    "RULES",
    "Revision",
    "RevisionTable",
    "TABLE",
    "get",
    "names",
    "newest",
    "check",
    "Release",
    "ReleaseError",
    "for_release",
]

#: Every rule a revision can set, with the values it may take (the first row sets them all).
RULES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "writer_scale": ("flt_min", "pow2_1e-4"),
        "context_chunks": ("equal_width", "packing_planner"),
        "convert_counted": ("in_place", "compact"),
    }
)


@dataclass(frozen=True, kw_only=True)
class Revision:
    """One revision: its name, the upstream change and its source, and every rule's value (the
    ones it changes against the revision before it in ``changes``)."""

    name: str
    change: str  # the upstream change that made this revision, in words, with its PR
    source: str  # where that change is: file @ commit
    rules: Mapping[str, str]  # every rule -> its value under this revision
    changes: tuple[str, ...] = ()  # the rules whose value differs from the revision before

    def rule(self, name: str) -> str:
        """This revision's value of rule ``name`` (KeyError naming the rules for an unknown one)."""
        try:
            return self.rules[name]
        except KeyError:
            raise KeyError(f"rule {name!r} is not a contract rule (rules: {', '.join(self.rules)})") from None


class ReleaseError(ValueError):
    """A vLLM version that no release row covers (or whose rules no revision has): one line."""


@dataclass(frozen=True, kw_only=True)
class Release:
    """One vLLM release as published (SPEC 10): every rule's value as read from its wheel, and
    where in the wheel each was read. Its patch releases (``0.27.1``) are taken to share its rules:
    the series ``major.minor`` is what a version is matched on."""

    version: str  # e.g. "0.30.0"
    rules: Mapping[str, str]  # every rule -> its value in this release
    evidence: str  # where the rules were read in the wheel, in words

    @property
    def series(self) -> str:
        return _series(self.version) or self.version


def _series(version: str) -> str | None:
    """'0.34' of '0.34.0', 'v0.34.1+cu129', '0.34.0rc1'; None for text that is no version."""
    head = version.strip().lstrip("vV").split("+")[0]
    parts = head.split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = "".join(c for c in parts[1] if c.isdigit()) if parts[1][:1].isdigit() else ""
    return f"{int(parts[0])}.{int(minor)}" if minor else None


@dataclass(frozen=True)
class RevisionTable:
    """The revisions, oldest first (the newest is every run's default), and vLLM's releases."""

    rows: tuple[Revision, ...]
    rules: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: RULES)
    releases: tuple[Release, ...] = ()

    def __post_init__(self) -> None:
        seen = [r.name for r in self.rows]
        if not seen or len(set(seen)) != len(seen):
            raise ValueError(f"RevisionTable: rows={seen} must be non-empty with distinct names")
        for r in (*self.rows, *self.releases):
            what = f"revision {r.name}" if isinstance(r, Revision) else f"release {r.version}"
            if set(r.rules) != set(self.rules):
                raise ValueError(f"{what}: rules={sorted(r.rules)}, expected {sorted(self.rules)}")
            for k, v in r.rules.items():
                if v not in self.rules[k]:
                    raise ValueError(f"{what}: {k}={v!r}, expected one of {', '.join(self.rules[k])}")

    def for_release(self, version: str) -> Revision:
        """The revision whose rules are vLLM ``version``'s (matched on its series, major.minor);
        ReleaseError naming the known releases for a version no release row covers."""
        series = _series(version)
        release = next((r for r in self.releases if r.series == series), None)
        if release is None:
            known = ", ".join(r.version for r in self.releases)
            raise ReleaseError(
                f"vLLM {version} is not a release mlafuzz knows (known: {known}); name a contract"
                f" revision with --revision ({', '.join(self.names)})"
            )
        match = [r for r in self.rows if dict(r.rules) == dict(release.rules)]
        if not match:
            rules = ", ".join(f"{k} {v}" for k, v in release.rules.items())
            raise ReleaseError(f"vLLM {release.version}'s rules ({rules}) are no contract revision's")
        return match[-1]

    def releases_of(self, name: str) -> tuple[str, ...]:
        """The releases whose rules are revision ``name``'s (the releases it matches)."""
        row = self.get(name)
        return tuple(r.version for r in self.releases if dict(r.rules) == dict(row.rules))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rows)

    @property
    def newest(self) -> Revision:
        return self.rows[-1]

    def get(self, name: object) -> Revision:
        for r in self.rows:
            if r.name == name:
                return r
        raise ValueError(f"revision={name!r}: expected one of {', '.join(self.names)}")

    def with_revision(
        self, *, name: str, change: str, source: str, rules: Mapping[str, str], values: Mapping[str, str] = {}
    ) -> RevisionTable:
        """This table with a new newest row: the newest's rules with ``rules`` changed. ``values``
        adds a new value of a rule (its implementation is the rule's own business)."""
        known = dict(self.rules)
        for k, v in values.items():
            known[k] = known[k] + (v,)
        row = _row(self.newest, name=name, change=change, source=source, rules=rules)
        return RevisionTable(self.rows + (row,), MappingProxyType(known), self.releases)


def _row(before: Revision | None, *, name: str, change: str, source: str, rules: Mapping[str, str]) -> Revision:
    inherited = dict(before.rules) if before is not None else {}
    changed = tuple(k for k, v in rules.items() if inherited.get(k) != v)
    return Revision(
        name=name,
        change=change,
        source=source,
        rules=MappingProxyType({**inherited, **rules}),
        changes=changed,
    )


def _table() -> RevisionTable:
    r07 = _row(
        None,
        name="2026-07",
        change="vLLM PR #48642 (fp8_ds_mla dense prefill, seq_starts): docs/contract.md's op sections as written",
        source="csrc/libtorch_stable/cache_kernels.cu @ 00eb0c874eb5",
        rules={"writer_scale": "flt_min", "context_chunks": "equal_width", "convert_counted": "in_place"},
    )
    r09 = _row(
        r07,
        name="2026-09",
        change="vLLM PR #49435: the writer's tile scale floored at 1e-4f and rounded up to a power of two",
        source="csrc/libtorch_stable/cache_kernels.cu @ 2a814fefa0e5",
        rules={"writer_scale": "pow2_1e-4"},
    )
    r10 = _row(
        r09,
        name="2026-10",
        change="vLLM PR #50613: the packing chunk planner (plan_mla_context_chunks) in place of equal-width chunks",
        source="vllm/model_executor/layers/attention/mla_attention.py (plan_mla_context_chunks)",
        rules={"context_chunks": "packing_planner"},
    )
    r11 = _row(
        r10,
        name="2026-11",
        change="vLLM 0.30.0: the convert launched with COMPACT_TO_FRONT = return_valid_counts (a counted row compacted)",
        source="vllm/v1/attention/backends/mla/sparse_utils.py (vllm==0.30.0 wheel)",
        rules={"convert_counted": "compact"},
    )
    # Releases pair rules that no dated revision pairs: 0.28.0-0.30.0 keep the writer's FLT_MIN
    # floor beside the packing planner (SPEC 10). Placed before 2026-10 so the newest stays dated.
    v28 = _row(
        r07,
        name="vllm-0.28",
        change="vLLM 0.28.0-0.29.0 as released: the packing planner with the FLT_MIN writer",
        source="vllm==0.28.0 wheel: mla_attention.py (plan_mla_context_chunks), models/deepseek_v32/common/kernels.py",
        rules={"context_chunks": "packing_planner"},
    )
    v30 = _row(
        v28,
        name="vllm-0.30",
        change="vLLM 0.30.0 as released: a counted convert row compacted, still the FLT_MIN writer",
        source="vllm==0.30.0 wheel: v1/attention/backends/mla/sparse_utils.py (COMPACT_TO_FRONT)",
        rules={"convert_counted": "compact"},
    )
    return RevisionTable((r07, r09, v28, v30, r10, r11), releases=_releases())


# Where each rule was read in a release's wheel (SPEC 10): the fused Triton fp8_ds_mla writer in
# vllm/models/deepseek_v32/common/kernels.py (its tile-scale floor), plan_mla_context_chunks in
# vllm/model_executor/layers/attention/mla_attention.py, and the convert's COMPACT_TO_FRONT launch
# in vllm/v1/attention/backends/mla/sparse_utils.py.
_WRITER_FLT_MIN = "writer: tile_amax / 448 floored at 1.1754944e-38"
_WRITER_POW2 = "writer: max(tile_amax / FP8_MAX, 1e-4) rounded up by exp2(ceil(log2))"


def _releases() -> tuple[Release, ...]:
    def release(version: str, scale: str, chunks: str, counted: str) -> Release:
        said = {
            "flt_min": _WRITER_FLT_MIN,
            "pow2_1e-4": _WRITER_POW2,
            "equal_width": "no plan_mla_context_chunks",
            "packing_planner": "plan_mla_context_chunks",
            "in_place": "no COMPACT_TO_FRONT launch",
            "compact": "COMPACT_TO_FRONT = return_valid_counts",
        }
        return Release(
            version=version,
            rules=MappingProxyType({"writer_scale": scale, "context_chunks": chunks, "convert_counted": counted}),
            evidence="; ".join(said[v] for v in (scale, chunks, counted)),
        )

    return (
        release("0.27.0", "flt_min", "equal_width", "in_place"),
        release("0.28.0", "flt_min", "packing_planner", "in_place"),
        release("0.29.0", "flt_min", "packing_planner", "in_place"),
        release("0.30.0", "flt_min", "packing_planner", "compact"),
        *(release(v, "pow2_1e-4", "packing_planner", "compact") for v in ("0.31.0", "0.32.0", "0.33.0", "0.34.0")),
    )


#: The revisions, oldest first. Read it through ``get``/``names``/``newest`` at call time, so that a
#: test's table (``monkeypatch.setattr(revisions, "TABLE", ...)``) is the one every layer sees.
TABLE: RevisionTable = _table()


def get(name: object) -> Revision:
    """The row of revision ``name``; ValueError naming the revisions for an unknown one."""
    return TABLE.get(name)


def names() -> tuple[str, ...]:
    return TABLE.names


def newest() -> str:
    return TABLE.newest.name


def check(name: object) -> str:
    """``name`` if it is a revision (ValueError otherwise)."""
    return get(name).name


def for_release(version: str) -> str:
    """The name of the revision vLLM ``version`` maps to (ReleaseError, one line, otherwise)."""
    return TABLE.for_release(version).name
