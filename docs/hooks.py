"""MkDocs hook: the configuration page's table of `Config` fields, made from the code, the
Results page's tables, made from `cvae eval`'s JSON (docs/results_page.py), and a check that
every table on every page has as many cells in each row as in its header.

Each field's one-sentence doc lives once, in `cvae/config/sections.py` (`cvae train --help`
shows it too); a page that says `<!-- config-fields -->` gets a table of every field's flag,
default and doc, so the site cannot drift from the code. The checkout's own `cvae` is imported
(its root first on sys.path), not whichever one the environment has installed.

The table check: Python-Markdown's tables extension splits a row at every `|` that is neither
escaped (`\\|`) nor inside a code span, pads a short row with empty cells and drops the cells
past the header's count without a word, so an unescaped `q(y|x)` cut a description short and
`mkdocs build --strict` passed. `table_problems` counts cells the same way and the build fails
on a row whose count differs from its header's (tests/test_docs.py runs it over README.md too).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path

MARKER = "<!-- config-fields -->"
ROOT = Path(__file__).resolve().parent.parent


def config_table() -> str:
    """Every setting by its path (`cvae.config.flat.all_leaves`), with its flag, its default
    (the default preset's; for an option of a component it does not name, the option's own)
    and its doc; a component's option says which components have it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from cvae.config import components, flat
    from cvae.config.sections import Config

    values = Config().leaves()
    flags = {path: name for name, path in flat.flat_names(Config).items()}
    rows = ["| setting | flag | default | what |", "|---|---|---|---|"]
    for path, leaf in flat.all_leaves(Config).items():
        kind = path.split(".")[0]
        value = values.get(path, next(f.default for f in dataclasses.fields(leaf.owner)
                                      if f.name == leaf.field))
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        doc = leaf.doc
        if leaf.field == "name" and kind in components.KINDS:
            about = (inspect.getdoc(leaf.owner) or "").split(": ", 1)[-1].split(" (")[0]
            doc = f"{about}: {', '.join(components.names(kind))}."
        if leaf.components:
            doc = f"{kind.capitalize()} {' or '.join(leaf.components)} only: {doc}"
        doc = doc.replace("|", "\\|")
        flag = "--" + flags[path].replace("_", "-")
        rows.append(f"| `{path}` | `{flag}` | `{shown}` | {doc} |")
    return "\n".join(rows)


def results_tables(markdown: str) -> str:
    """The Results page's tables from the eval JSON in docs/results/ (docs/results_page.py)."""
    if str(ROOT / "docs") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs"))
    from results_page import render

    return render(markdown)


# A table's second line: cells of dashes with optional alignment colons, e.g. |---|:--:|--:|
DELIMITER_ROW = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$")
FENCE = re.compile(r"^(`{3,}|~{3,})")
# Python-Markdown's own tokens (markdown/extensions/tables.py, RE_CODE_PIPES and RE_END_BORDER):
# an escaped backslash, an escaped backtick run, a backtick run, an escaped pipe, a pipe.
ROW_TOKENS = re.compile(r"(\\\\)|(\\`+)|(`+)|(\\\|)|(\|)")
END_BORDER = re.compile(r"(?<!\\)(?:\\\\)*\|$")


def table_cells(row: str, border: bool = True) -> list[str]:
    """A table row's cells as Python-Markdown's tables extension splits it: at each `|` that is
    not escaped (`\\|`) and not inside a code span (from a run of backticks to the next run of
    the same length), after dropping the border pipes of a table whose header has them."""
    row = row.strip()
    if border:
        row = END_BORDER.sub("", row[1:] if row.startswith("|") else row)
    runs, pipes = [], []  # runs: (length, first, last, escaped)
    for token in ROW_TOKENS.finditer(row):
        if token.group(2):
            runs.append((len(token.group(2)) - 1, token.start(2), token.end(2) - 1, 1))
        elif token.group(3):
            runs.append((len(token.group(3)), token.start(3), token.end(3) - 1, 0))
        elif token.group(5):
            pipes.append(token.start(5))
    spans, index = [], 0
    while index < len(runs):
        length = runs[index][0] - runs[index][3]
        close = next((j for j in range(index + 1, len(runs)) if runs[j][0] == length), None)
        if length == 0 or close is None:
            index += 1
            continue
        spans.append((runs[index][1], runs[close][2]))
        index = close + 1
    cuts = [pipe for pipe in pipes if not any(first <= pipe <= last for first, last in spans)]
    edges = [-1, *cuts, len(row)]
    return [row[left + 1:right].strip() for left, right in zip(edges, edges[1:])]


def table_problems(markdown: str) -> list[str]:
    """One line per table row whose cell count differs from its header's (fenced code skipped):
    'line 24: 4 cells, the header has 3: | `--classifier-weight` | ...'."""
    lines = markdown.splitlines()
    problems, fence, index = [], None, 0
    while index < len(lines):
        stripped = lines[index].strip()
        if (opening := FENCE.match(stripped)):
            if fence is None:
                fence = opening.group(1)[0] * 3
            elif stripped.startswith(fence):
                fence = None
        elif (fence is None and "|" in stripped and index + 1 < len(lines)
              and DELIMITER_ROW.match(lines[index + 1].strip())):
            border = stripped.startswith("|") or stripped.endswith("|")
            header = len(table_cells(stripped, border))
            row = index + 2
            while row < len(lines) and lines[row].strip() and "|" in lines[row]:
                cells = len(table_cells(lines[row], border))
                if cells != header:
                    problems.append(f"line {row + 1}: {cells} cells, the header has {header}: "
                                    f"{lines[row].strip()[:80]}")
                row += 1
            index = row
            continue
        index += 1
    return problems


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, config_table())
    markdown = results_tables(markdown)
    if (problems := table_problems(markdown)):
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_uri}: a table row has more or fewer cells than its "
                          "header (escape a | in a cell as \\|):\n  " + "\n  ".join(problems))
    return markdown
