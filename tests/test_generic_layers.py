"""The generic layers name no algorithm: what differs by algorithm is asked of its record in
the registry (``zrl.algos.registry``), so a new algorithm is one leaf folder.

Checked on the code, not the prose: every string constant that is not a docstring, and every
identifier, in ``config/``, ``roles/``, ``broker/``, ``run/`` and ``nets/``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from zrl.algos.registry import BUILT_IN

ZRL = Path(__file__).resolve().parent.parent / "zrl"
GENERIC = ("config", "roles", "broker", "run", "nets")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    # An attribute's docstring: a string statement right after an assignment.
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for before, after in zip(stmts, stmts[1:], strict=False):
                if (
                    isinstance(before, ast.Assign | ast.AnnAssign)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                ):
                    found.add(id(after.value))
    return found


def names_in_code(path: Path, pattern: re.Pattern[str]) -> list[str]:
    """``line: text`` of each string constant (not a docstring) or identifier in ``path``
    that names an algorithm."""
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        if text is not None and pattern.search(text):
            hits.append(f"{path.name}:{node.lineno}: {text[:80]!r}")
    return hits


@pytest.mark.parametrize("folder", GENERIC)
def test_no_algorithm_is_named_in_the_generic_layers(folder: str) -> None:
    pattern = re.compile(r"\b(" + "|".join(sorted(BUILT_IN)) + r")\b")
    hits = [
        hit for path in sorted((ZRL / folder).rglob("*.py")) for hit in names_in_code(path, pattern)
    ]
    assert not hits, "\n".join(hits)


def test_the_check_finds_a_planted_name(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('"""Docstrings may say sac."""\nKIND = "sac"\nif algo == "ppo":\n    pass\n')
    pattern = re.compile(r"\b(sac|ppo)\b")
    hits = names_in_code(planted, pattern)
    assert len(hits) == 2 and "'sac'" in hits[0] and "'ppo'" in hits[1], hits
