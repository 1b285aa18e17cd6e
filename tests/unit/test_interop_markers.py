"""Every interop module is marked `interop`, so `-m interop` / `-m 'not interop'` select truly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
INTEROP_MODULES = sorted((TESTS / "interop").glob("test_*.py")) + sorted((TESTS / "network").glob("test_*.py"))


def module_marks(path: Path) -> set[str]:
    """Marker names in a module-level `pytestmark = ...` (a mark or a list of marks)."""
    marks: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                    marks.add(sub.attr)
    return marks


def test_there_are_interop_modules() -> None:
    assert len(INTEROP_MODULES) >= 10


@pytest.mark.parametrize("path", INTEROP_MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_interop_module_is_marked(path: Path) -> None:
    assert "interop" in module_marks(path), f"{path.name}: add `pytestmark = pytest.mark.interop`"


def test_marks_are_read_from_lists_and_calls(tmp_path: Path) -> None:
    f = tmp_path / "t.py"
    f.write_text("import pytest\npytestmark = [pytest.mark.interop, pytest.mark.timeout(9)]\n")
    assert module_marks(f) == {"interop", "timeout"}
    f.write_text("import pytest\nx = pytest.mark.interop\n")
    assert module_marks(f) == set()
