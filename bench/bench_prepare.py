"""`cvae data --from` on the three example data sets of docs/own-images.md: wall time and peak
memory of each preparation, one line per data set. Run by `bench/run.py` (not in --quick).

Each preparation runs as its own subprocess, and its peak resident set comes from that child's
own rusage (os.wait4), the figure `/usr/bin/time -v` prints as "Maximum resident set size".
The example files are written first (scripts/example_datasets.py) and are not timed. A data
set whose source is missing (scikit-learn for digits and colour, Debian's
dataset-fashion-mnist for the PNG folder) gets a line saying so instead.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "example_datasets.py"
# (name, what it is, the file the example script writes)
DATASETS = (("digits", "scikit-learn's 1,797 8x8 digits, an .npz", "digits.npz"),
            ("fashion", "Fashion-MNIST, 70,000 28x28 PNGs in class folders", "fashion"),
            ("colour", "1,797 seeded 32x32 colour digits, an .npz", "colour.npz"))


def missing_source(name: str) -> str | None:
    """Why `name`'s example cannot be written here, or None when it can."""
    if name == "fashion":
        from cvae.data.prepare import FASHION_MNIST_DEBIAN_DIR

        if not FASHION_MNIST_DEBIAN_DIR.is_dir():
            return f"{FASHION_MNIST_DEBIAN_DIR} is missing (apt-get install dataset-fashion-mnist)"
        return None
    if importlib.util.find_spec("sklearn") is None:
        return "scikit-learn is not installed (pip install -e '.[examples]')"
    return None


def timed_child(command: list[str]) -> tuple[float, int, int]:
    """Run `command`; (wall seconds, its peak resident set in bytes, its exit code)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen.wait
    child.stderr.close()
    return seconds, usage.ru_maxrss * 1024, child.returncode  # ru_maxrss is in KiB on Linux


def measure() -> dict:
    """{name: {"seconds", "peak_bytes"} or {"skipped": reason}} for each example data set."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="cvae-bench-prepare-") as scratch:
        for name, _, source in DATASETS:
            reason = missing_source(name)
            if reason is not None:
                results[name] = {"skipped": reason}
                continue
            subprocess.run([sys.executable, str(SCRIPT), name, str(Path(scratch, source))],
                           check=True, stdout=subprocess.DEVNULL)
            seconds, peak, code = timed_child(
                [sys.executable, "-m", "cvae.cli", "data", "--from", str(Path(scratch, source)),
                 "--name", name, "--data-dir", str(Path(scratch, "data"))])
            results[name] = ({"seconds": seconds, "peak_bytes": peak} if code == 0
                             else {"skipped": f"cvae data exited with {code}"})
    return results


def markdown(results: dict, tag: str) -> str:
    lines = [f"`cvae data --from SOURCE --name NAME` on the example data sets of "
             f"docs/own-images.md, one subprocess each, on `{tag}` (writing the sources is not "
             "timed; peak memory is the child's maximum resident set):", "",
             "| data set | source | wall time | peak memory |", "|---|---|---:|---:|"]
    for name, what, _ in DATASETS:
        r = results[name]
        if "skipped" in r:
            lines.append(f"| {name} | {what} | skipped: {r['skipped']} | |")
        else:
            lines.append(f"| {name} | {what} | {r['seconds']:.1f} s | "
                         f"{r['peak_bytes'] / 2**20:.0f} MiB |")
    return "\n".join(lines)
