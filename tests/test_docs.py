"""The user documentation as a reader meets it: README.md and docs/*.md.

Every table renders with the cells its header promises (docs/hooks.py's check, which also fails
`make docs`), and the pages speak to users, without the project's internal history.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# Each row's cells as Python-Markdown 3.x renders them (its tables extension, as `make docs`
# builds the site): pipes inside code spans and escaped pipes do not split a cell.
SPLITS = [
    ("| a | b |", ["a", "b"]),
    ("a | b", ["a", "b"]),
    ("| q(y|x) | c |", ["q(y", "x)", "c"]),
    (r"| q(y\|x) | c |", [r"q(y\|x)", "c"]),
    ("| `q(y|x)` | c |", ["`q(y|x)`", "c"]),
    ("| ``a|`b`` | c |", ["``a|`b``", "c"]),
    ("| `a | b |", ["`a", "b"]),  # an unclosed backtick opens no code span
    ("| a \\\\| b |", ["a \\\\", "b"]),  # an escaped backslash, then a real pipe
]


@pytest.mark.parametrize("row, cells", SPLITS)
def test_table_cells_are_split_where_python_markdown_splits_them(row, cells):
    assert hooks.table_cells(row) == cells


def test_a_row_with_an_unescaped_pipe_is_reported_with_its_line():
    page = ("Text | not a table\n\n| flag | what |\n|---|---|\n| `--a` | fine |\n"
            "| `--b` | reads q(y|x) |\n\n```\n| a | b |\n|---|\n| c |\n```\n")
    assert hooks.table_problems(page) == [
        "line 6: 3 cells, the header has 2: | `--b` | reads q(y|x) |"]
    assert hooks.table_problems(page.replace("q(y|x)", r"q(y\|x)")) == []


def test_a_short_row_is_reported_too():
    assert hooks.table_problems("| a | b | c |\n|---|---|---|\n| 1 | 2 |\n") == [
        "line 3: 2 cells, the header has 3: | 1 | 2 |"]


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_every_table_row_has_as_many_cells_as_its_header(path):
    assert hooks.table_problems(path.read_text()) == []


def test_the_site_wraps_long_code_lines():
    """A code line wider than its box wraps (docs/stylesheets/extra.css) instead of hiding
    behind the box's edge: mkdocs.yml loads the stylesheet, and it overrides the theme's rule
    for `.md-typeset pre > code` with pre-wrap. (Checked on the built site in Chromium: no code
    block overflows at 1280, 900 or 420 px.)"""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "stylesheets/extra.css" in config["extra_css"]
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    rule = re.search(r"\.md-typeset pre > code \{([^}]*)\}", css)
    assert rule and re.search(r"white-space:\s*pre-wrap", rule.group(1))
    assert re.search(r"overflow-wrap:\s*anywhere", rule.group(1))  # long URLs break too
