"""How long a fresh process takes to answer: `cvae serve` to its first 200 from /readyz, and
`cvae sample` to its PNG, for the default model, a convolutional one and (where Debian's
dataset-fashion-mnist is installed; not with --quick) Fashion-MNIST's chosen model, each
exported.

    python -m bench.bench_startup --checkpoint-dir checkpoints [--quick]

Three starts, interleaved in rounds: `cold` (--compilation-cache off: every program compiled),
`cached` (a cache an earlier start on this machine filled) and `carried` (an empty cache, seeded
from the programs the export carries: cvae/export/compiled.py). The serve log's "loaded step N
in X s" line gives the part spent loading and compiling; the rest is the interpreter, imports
and gunicorn. Medians of the rounds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.rounds import interleaved
from bench.servers import free_port, running

STARTS = ("cold", "cached", "carried")
LOADED = re.compile(r"loaded step \d+ in ([\d.]+) s")


def cvae(*args: str) -> list[str]:
    return [sys.executable, "-m", "cvae.cli", *args]


def cache_for(start: str, root: Path, round_index: list[int]) -> str:
    """The --compilation-cache value of one start: off, the shared warm one, or a new empty
    directory (each carried start seeds its own)."""
    if start == "cold":
        return "off"
    if start == "cached":
        return str(root / "warm")
    round_index[0] += 1
    return str(root / f"empty-{round_index[0]}")


def serve_once(folder: Path, cache: str, log_dir: Path) -> dict:
    """Seconds from spawning `cvae serve` to /readyz's 200, and the log's load time."""
    port = free_port()
    log_path = log_dir / f"serve-{port}.log"
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        command = cvae("serve", "--checkpoint-dir", str(folder), "--port", str(port),
                       "--workers", "1", "--compilation-cache", cache)
        with running(command, port, 1, stdout=log) as _pid:
            ready = time.perf_counter() - started
    loaded = LOADED.search(log_path.read_text(errors="replace"))
    return {"ready_s": ready, "load_s": float(loaded[1]) if loaded else None}


def sample_once(folder: Path, cache: str, out: Path) -> dict:
    started = time.perf_counter()
    subprocess.run(cvae("sample", "--checkpoint-dir", str(folder), "--out", str(out),
                        "--compilation-cache", cache), check=True, capture_output=True)
    return {"png_s": time.perf_counter() - started}


def measure_model(folder: Path, rounds: int, workdir: Path) -> dict:
    """Medians per start kind, serve and sample, over interleaved rounds."""
    counter = [0]
    serve_once(folder, str(workdir / "warm"), workdir)  # fills the warm cache
    candidates = {start: (lambda start=start: {
        **serve_once(folder, cache_for(start, workdir, counter), workdir),
        **sample_once(folder, cache_for(start, workdir, counter), workdir / "grid.png")})
        for start in STARTS}
    runs = interleaved(candidates, rounds)
    return {start: {key: statistics.median(r[key] for r in results if r[key] is not None)
                    for key in ("ready_s", "load_s", "png_s")}
            for start, results in runs.items()}


def export(checkpoint_dir: Path, out: Path) -> Path:
    subprocess.run(cvae("export", "--checkpoint-dir", str(checkpoint_dir), "--out", str(out),
                        "--compilation-cache", "off"), check=True, capture_output=True)
    return out


def conv_checkpoint(data_dir: str, workdir: Path, quick: bool) -> Path:
    """A `--preset conv` run of one step: start-up does not depend on the weights."""
    directory = workdir / "conv"
    if quick:  # the synthetic digits, as MNIST's files
        from cvae.data.synthetic import write_synthetic_idx

        write_synthetic_idx(workdir / "data")
        data_dir = str(workdir / "data")
    small = ["--validation-size", "16"] if quick else []
    subprocess.run(cvae("train", "--preset", "conv", "--data-dir", data_dir, *small,
                        "--checkpoint-dir", str(directory),
                        "--max-steps", "1", "--steps-per-call", "1"), check=True,
                   capture_output=True)
    return directory


def fashion_checkpoint(data_dir: str, workdir: Path) -> Path | None:
    """A one-step run of Fashion-MNIST with the model `cvae train` chooses for it (the logistic
    mixture's larger decoder); None where `cvae data --dataset fashion_mnist` cannot prepare it
    (Debian's dataset-fashion-mnist not installed)."""
    prepared = subprocess.run(cvae("data", "--dataset", "fashion_mnist", "--data-dir", data_dir),
                              capture_output=True)
    if prepared.returncode != 0:
        return None
    directory = workdir / "fashion"
    subprocess.run(cvae("train", "--dataset", "fashion_mnist", "--data-dir", data_dir,
                        "--checkpoint-dir", str(directory), "--max-steps", "1"), check=True,
                   capture_output=True)
    return directory


def measure(checkpoint_dir: str, data_dir: str, rounds: int = 3, quick: bool = False) -> dict:
    results = {}
    with tempfile.TemporaryDirectory(prefix="cvae-bench-startup-") as root:
        workdir = Path(root)
        models = {"default": Path(checkpoint_dir),
                  "conv": conv_checkpoint(data_dir, workdir, quick)}
        fashion = None if quick else fashion_checkpoint(data_dir, workdir)
        if fashion is not None:
            models["fashion_mnist"] = fashion
        for name, directory in models.items():
            folder = export(directory, workdir / f"export-{name}")
            model_dir = workdir / f"starts-{name}"
            model_dir.mkdir()
            results[name] = measure_model(folder, rounds, model_dir)
    return results


def markdown(results: dict, tag: str) -> str:
    lines = [f"From spawning the process to its answer, on `{tag}`; medians of interleaved "
             "rounds. `cold`: --compilation-cache off; `cached`: a cache an earlier start "
             "filled; `carried`: an empty cache seeded from the programs the export carries.",
             "", "| model | start | serve: /readyz 200 | of it, loading and compiling | "
             "`cvae sample`: PNG written |", "|---|---|---:|---:|---:|"]
    for model, starts in results.items():
        for start, figures in starts.items():
            lines.append(f"| {model} | {start} | {figures['ready_s']:.1f} s | "
                         f"{figures['load_s']:.1f} s | {figures['png_s']:.1f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--machine-tag", default="this machine")
    args = parser.parse_args(argv)
    print(markdown(measure(args.checkpoint_dir, args.data_dir, args.rounds, args.quick),
                   args.machine_tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
