"""experiments/LOG.md names only what exists, or says where it went in git.

The log keeps its history: a file or module it names (`cvae/...py`, `bench/...py`,
`service/...py`, `experiments/...py`, `tests/...py`, or dotted, `cvae.x.y`, `bench.x`) either
exists in the checkout, or its paragraph (a list item, a table, a code block or a run of lines
between blank lines) goes on to say where it went: "deleted in <sha>" or `git show <sha>^:path`.
A name so explained once is explained for the whole log, so one note covers a group of names
(the "Scripts." paragraph at the top covers the deleted bench scripts that many commands call).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "experiments" / "LOG.md"

PACKAGES = "cvae|bench|service|experiments|tests"
PATH = re.compile(rf"(?<![\w./-])((?:{PACKAGES})/[\w/-]+\.py)(?!\w)")
MODULE = re.compile(rf"(?<![\w./-])((?:{PACKAGES})(?:\.[A-Za-z_]\w*)+)(?![\w/])")
SHA = r"[0-9a-f]{7,40}"
GIT_SHOW = re.compile(rf"git show\s+({SHA})\^:([\w./-]*\w)")
NOTE = re.compile(rf"{GIT_SHOW.pattern}|deleted in\s+({SHA})")
FENCE = re.compile(r"^\s*(```|~~~)")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
FILE_SUFFIXES = {"py", "md", "json", "toml", "txt", "yaml", "yml"}


def paragraphs(text: str) -> list[str]:
    """The text's paragraphs: runs of lines between blank lines, each list item on its own, each
    fenced code block whole."""
    found, lines, fence = [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            if not fence and lines:
                found.append(lines)
                lines = []
            lines.append(line)
            fence = not fence
            if not fence:
                found.append(lines)
                lines = []
        elif fence:
            lines.append(line)
        elif not line.strip() or ITEM.match(line):
            if lines:
                found.append(lines)
            lines = [line] if line.strip() else []
        else:
            lines.append(line)
    if lines:
        found.append(lines)
    return ["\n".join(lines) for lines in found]


def defines(source: Path, name: str) -> bool:
    return re.search(rf"^(?:(?:async\s+)?def|class)\s+{name}\b|^{name}\s*[:=]|"
                     rf"^(?:from\s+\S+\s+)?import\s.*\b{name}\b", source.read_text(),
                     re.MULTILINE) is not None


def exists(name: str, root: Path = ROOT) -> bool:
    """A path exists as a file; a dotted name as a module or package, or a name that one
    defines (`bench.machine.gemm_gflops`)."""
    if "/" in name:
        return (root / name).is_file()
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:end])
        source = next((path for path in (base.with_suffix(".py"), base / "__init__.py")
                       if path.is_file()), None)
        if source is not None:
            return end == len(parts) or defines(source, parts[end])
    return False


def key(name: str) -> str:
    """One spelling for a module and its file: bench.model_levers -> bench/model_levers.py."""
    return name if "/" in name else name.replace(".", "/") + ".py"


def mentions(paragraph: str):
    """(position, name) of every path and dotted module the paragraph names, less the paths
    that its `git show sha^:path` notes restore."""
    notes = [match.span(2) for match in GIT_SHOW.finditer(paragraph)]
    for match in PATH.finditer(paragraph):
        if not any(start <= match.start() < end for start, end in notes):
            yield match.start(), match.group(1)
    for match in MODULE.finditer(paragraph):
        if match.group(1).rsplit(".", 1)[-1] not in FILE_SUFFIXES:
            yield match.start(), match.group(1)


def unexplained(text: str, root: Path = ROOT) -> list[str]:
    """Every name the log gives that does not exist and that no note explains, with the first
    line of its paragraph."""
    explained, missing = set(), []
    for paragraph in paragraphs(text):
        notes = [match.start() for match in NOTE.finditer(paragraph)]
        explained.update(key(match.group(2)) for match in GIT_SHOW.finditer(paragraph))
        for position, name in mentions(paragraph):
            if exists(name, root):
                continue
            if any(note > position for note in notes):
                explained.add(key(name))
            else:
                missing.append((name, paragraph.splitlines()[0].strip()))
    return sorted({f"{name} (in: {first[:80]!r})" for name, first in missing
                   if key(name) not in explained})


def test_every_name_the_log_gives_exists_or_says_where_it_went():
    assert unexplained(LOG.read_text()) == []


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_every_note_in_the_log_names_a_commit_and_git_show_restores_its_file():
    """Each "deleted in sha" names a commit, and each `git show sha^:path` one whose parent holds
    the path. A shallow clone checks the commits it has."""
    if shutil.which("git") is None or git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    text = LOG.read_text()
    shows = set(GIT_SHOW.findall(text))
    shas = {sha for sha, _ in shows} | set(re.findall(rf"deleted in\s+({SHA})", text))
    absent = {sha for sha in shas if git("cat-file", "-e", f"{sha}^{{commit}}").returncode}
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        shas -= absent
        if not shas:
            pytest.skip("the notes' commits are not in this shallow clone")
    else:
        assert sorted(absent) == []
    assert sorted(f"{sha}^:{path}" for sha, path in shows if sha in shas
                  and git("cat-file", "-e", f"{sha}^:{path}").returncode) == []


def test_the_check_catches_what_it_is_for(tmp_path):
    (tmp_path / "cvae").mkdir()
    (tmp_path / "cvae" / "__init__.py").write_text("")
    (tmp_path / "cvae" / "kept.py").write_text("def there():\n    pass\n")
    log = "\n".join([
        "Kept: `cvae/kept.py`, `cvae.kept`, `cvae.kept.there`.",
        "",
        "- Gone: `cvae/gone.py` and `python -m cvae.lost`, `cvae.kept.not_there`.",
        "- Noted: `cvae/old.py` (deleted in abc1234).",
        "- Restored: `git show abc1234^:cvae/older.py` gives `cvae/older.py`.",
        "",
        "**Scripts.** `bench.tool` and `bench.other` went:",
        "`git show abc1234^:bench/tool.py` (likewise for the other).",
        "",
        "```",
        "python -m bench.other --flag",
        "python -m bench.unnoted",
        "```",
        "",
        "A note before its name does not count: deleted in abc1234, `cvae/late.py`.",
    ])
    assert [line.split(" (in:")[0] for line in unexplained(log, tmp_path)] == [
        "bench.unnoted", "cvae.kept.not_there", "cvae.lost", "cvae/gone.py", "cvae/late.py"]
    assert paragraphs("a\n- b\n  c\n\n```\nx\n\ny\n```\nd")[1:] == ["- b\n  c", "```\nx\n\ny\n```",
                                                                   "d"]
