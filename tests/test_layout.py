"""The size limits of docs/design.md: no module over 400 lines and no function over 80 in cvae/
and service/, so every piece can be read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(path for package in ("cvae", "service") for path in (ROOT / package).rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_module_and_its_functions_are_within_the_size_limits(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert long == {}
