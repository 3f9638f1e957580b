"""The op table's names, importable without torch: what ``mlafuzz --help`` lists.

table.py checks at import that OPS holds exactly these, in this order, so the
two cannot drift apart.
"""

NAMES: tuple[str, ...] = ("convert", "gather", "writer", "step")
