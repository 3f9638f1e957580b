"""What users read is in the repository: the README is a short guide, and every message that cites
the contract points at docs/contract.md's sections, never at a file outside the project."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "reports", "kernels", "generators", "oracles")
README = ROOT / "README.md"
CONTRACT = ROOT / "docs" / "contract.md"


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that a user can see: not docstrings (comments are not
    constants at all)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_message_or_help_cites_a_spec_file_users_do_not_have():
    cited = [f"{p.relative_to(ROOT)}:{n}: {s[:80]!r}" for p in _sources() for n, s in _strings(p) if "SPEC" in s]
    assert not cited, "cite docs/contract.md (a section) instead:\n" + "\n".join(cited)


def test_every_contract_section_a_message_names_exists():
    headings = [h.lower() for h in re.findall(r"^## (.+)$", CONTRACT.read_text(encoding="utf-8"), flags=re.M)]
    named = {
        (str(p.relative_to(ROOT)), word)
        for p in _sources()
        for _, s in _strings(p)
        for word in re.findall(r"docs/contract\.md, (\w+)", s)
    }
    assert named, "no message cites a section of docs/contract.md"
    missing = sorted(
        f"{where}: {word}" for where, word in named if not any(h.startswith(word.lower()) for h in headings)
    )
    assert not missing, f"sections not in docs/contract.md: {missing}"


def test_readme_is_a_short_guide_whose_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text) <= 12_000, f"README.md is {len(text)} characters; measurements go to docs/performance.md"
    assert "SPEC" not in text
    for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / link).exists(), f"README links to {link}, which is not in the repository"


@pytest.mark.parametrize("doc", ["contract.md", "performance.md", "architecture.md"])
def test_the_docs_beside_the_readme_exist_and_cite_no_spec_file(doc):
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    assert "SPEC" not in text, f"docs/{doc} cites SPEC, a file users do not have"


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = ".venv/bin/python -m pytest -n 2 -q"
    assert command in ci and f"bash .ci/setup && {command}" in README.read_text(encoding="utf-8")
