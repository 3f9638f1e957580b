"""The op table's names and the contract revisions, importable without torch: what ``mlafuzz --help`` lists.

table.py checks at import that OPS holds exactly these ops, in this order, so
they cannot drift apart. The revisions are the revision table's
(``mlafuzz.oracles.revisions``, torch-free too), never spelled here.
"""

from mlafuzz.oracles import revisions

NAMES: tuple[str, ...] = (
    "convert",
    "gather",
    "writer",
    "step",
    "plan",
    "dcp",
    "dcp_peer",
    "nvfp4_gather",
    "nvfp4_writer",
)
# SPEC section 7's contract revisions, oldest first; the newest is every run's default.
REVISIONS: tuple[str, ...] = revisions.names()
NEWEST_REVISION: str = revisions.newest()
