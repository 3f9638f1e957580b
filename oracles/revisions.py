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


@dataclass(frozen=True)
class RevisionTable:
    """The revisions, oldest first; the newest is every run's default."""

    rows: tuple[Revision, ...]
    rules: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: RULES)

    def __post_init__(self) -> None:
        seen = [r.name for r in self.rows]
        if not seen or len(set(seen)) != len(seen):
            raise ValueError(f"RevisionTable: rows={seen} must be non-empty with distinct names")
        for r in self.rows:
            if set(r.rules) != set(self.rules):
                raise ValueError(f"revision {r.name}: rules={sorted(r.rules)}, expected {sorted(self.rules)}")
            for k, v in r.rules.items():
                if v not in self.rules[k]:
                    raise ValueError(f"revision {r.name}: {k}={v!r}, expected one of {', '.join(self.rules[k])}")

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
        return RevisionTable(self.rows + (row,), MappingProxyType(known))


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
        change="vLLM 0.30.0 launches the convert with COMPACT_TO_FRONT = return_valid_counts: a counted row's"
        " valid slots packed into columns [0, count), -1 after them",
        source="vllm 0.30.0 wheel: vllm/v1/attention/backends/mla/sparse_utils.py"
        " (triton_convert_req_index_to_global_index)",
        rules={"convert_counted": "compact"},
    )
    return RevisionTable((r07, r09, r10, r11))


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
