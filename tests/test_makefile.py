"""The Makefile as a newcomer meets it: `make` alone (= `make help`) lists every target with a
line saying what it does, read from the `## ` comment on the target's rule."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                          capture_output=True, text=True, timeout=60)


def phony_targets() -> list[str]:
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), flags=re.M)
    return phony.group(1).split()


def test_make_alone_lists_every_target_with_what_it_does():
    listing = make()
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout == make("help").stdout  # the default goal, and it installs nothing
    described = dict(re.findall(r"^  ([a-z][a-z-]*) +(\S.*)$", listing.stdout, flags=re.M))
    assert sorted(described) == sorted(phony_targets())
    for name in ("help", "setup", "train", "test", "serve", "docs", "clean"):
        assert len(described[name].split()) >= 3, (name, described[name])
    assert all(len(line) <= 100 for line in listing.stdout.splitlines())
