"""The record format is data (issue 39 item 1): fp8_ds_mla's record size (656) and its dequantized
row's width (576) are written as numbers in one place, the format table, and every generator,
oracle, detector, bundle and report reads them from it. A number literal 656 or 576 anywhere else
in the package is a second definition that a new format would silently disagree with.

Only number tokens count (``tokenize``): comments and docstrings may say 656, as they explain.
The kernels' own sources (kernels/csrc/*.cu, *.cuh) are not Python and keep their constants; a
Triton kernel body that needs one takes it as a constexpr argument, passed from the table.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("generators", "harness", "kernels", "oracles", "reports")
LITERALS = frozenset({"656", "576"})
# The one file that defines the layouts.
ALLOWED = frozenset({"oracles/formats/table.py"})


def layout_literals(source: str) -> list[tuple[int, str]]:
    """(line, token) of every number literal in ``source`` that spells a layout size."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.NUMBER and t.string in LITERALS]


def test_layout_sizes_are_spelled_only_in_the_format_table() -> None:
    found = [
        f"{rel}:{line}: {tok}"
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
        if (rel := path.relative_to(ROOT).as_posix()) not in ALLOWED
        for line, tok in layout_literals(path.read_text(encoding="utf-8"))
    ]
    assert not found, "read the size from oracles/formats/table.py (formats.get(name)):\n" + "\n".join(found)


def test_the_table_itself_spells_them_so_the_scan_sees_numbers() -> None:
    # The scan is not blind: the table's own literals are found, a comment's and a docstring's are not.
    table = (ROOT / "oracles/formats/table.py").read_text(encoding="utf-8")
    assert {tok for _, tok in layout_literals(table)} == LITERALS
    sample = '"""656 bytes"""\nx = 1  # 576 wide\ny = (n, 656)\n'
    assert layout_literals(sample) == [(3, "656")]
