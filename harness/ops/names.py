"""The op table's names and the contract revisions, importable without torch: what ``mlafuzz --help`` lists.

table.py checks at import that OPS holds exactly these ops, in this order, and
that the oracles know exactly these revisions (oracles/writer_scale.py), so
neither can drift apart.
"""

NAMES: tuple[str, ...] = ("convert", "gather", "writer", "step", "dcp", "dcp_peer")
# SPEC section 7's contract revisions, oldest first; the newest is every run's default.
REVISIONS: tuple[str, ...] = ("2026-07", "2026-09")
NEWEST_REVISION: str = REVISIONS[-1]
