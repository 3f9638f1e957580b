"""Cut a module's source down to some of its top-level functions and what they need.

``mla_attention.py`` is 3,600 lines that import half of vLLM (models, config, distributed,
custom ops); the fuzzed op needs one pure-Python function of it. ``slice_module`` keeps the
asked-for top-level definitions, then every top-level definition and imported name those refer
to, transitively, and drops the rest: the kept lines are the release's own, in their order, so
what runs is what the wheel ships. A name that is bound only inside a conditional block (``if
TYPE_CHECKING:``) is not followed; if a kept definition needs it at run time, the import of
the sliced module fails and says so.
"""

from __future__ import annotations

import ast
from typing import Iterable

__all__ = ["slice_module", "SliceError"]


class SliceError(ValueError):
    """The module does not define an asked-for name at its top level."""


def _bound(node: ast.stmt) -> set[str]:
    """The top-level names a statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _used(node: ast.AST) -> set[str]:
    """Every name a statement reads (decorators, annotations, defaults and bodies alike)."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    # String annotations (``"Foo | None"``) name things too.
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            names.add(n.value)
    return names


def _import_line(node: ast.Import | ast.ImportFrom, keep: set[str]) -> str:
    """The import statement with only the aliases that bind a kept name."""
    aliases = [a for a in node.names if (a.asname or a.name).split(".")[0] in keep]
    text = ", ".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in aliases)
    if isinstance(node, ast.Import):
        return f"import {text}"
    return f"from {'.' * node.level}{node.module or ''} import {text}"


def slice_module(source: str, wanted: Iterable[str], *, header: str = "") -> str:
    """The source of ``wanted`` (top-level names) and everything top-level they need."""
    tree = ast.parse(source)
    lines = source.splitlines()
    body = tree.body
    wanted = list(wanted)
    defined = set().union(*(_bound(n) for n in body))
    missing = [w for w in wanted if w not in defined]
    if missing:
        raise SliceError(f"the module defines no {', '.join(missing)} at its top level")
    need, todo = set(), list(wanted)
    while todo:
        name = todo.pop()
        if name in need:
            continue
        need.add(name)
        for node in body:
            if name in _bound(node) and not isinstance(node, (ast.Import, ast.ImportFrom)):
                todo.extend(_used(node) & defined)
    out = [header] if header else []
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            out.append(ast.get_source_segment(source, node) or "")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if _bound(node) & need:
                out.append(_import_line(node, need))
        elif _bound(node) & need:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            out.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n\n".join(out) + "\n"
