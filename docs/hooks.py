"""MkDocs hook: the configuration page's table of `Config` fields, made from the code.

Each field's one-sentence doc lives once, in `cvae/config.py` (`cvae train --help` shows it too);
a page that says `<!-- config-fields -->` gets a table of every field's flag, default and doc,
so the site cannot drift from the code. The checkout's own `cvae` is imported (its root first on
sys.path), not whichever one the environment has installed.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

MARKER = "<!-- config-fields -->"
ROOT = Path(__file__).resolve().parent.parent


def config_table() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from cvae.config import Config, field_doc

    defaults = Config()
    rows = ["| flag | default | what |", "|---|---|---|"]
    for field in dataclasses.fields(Config):
        value = getattr(defaults, field.name)
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        doc = field_doc(field.name).replace("|", "\\|")
        rows.append(f"| `--{field.name.replace('_', '-')}` | `{shown}` | {doc} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_table())
