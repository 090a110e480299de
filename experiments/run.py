"""Run an experiment (experiments/configs/NAME.py) through `cvae train` and `cvae eval`.

    python -m experiments.run NAME [--seeds 0,1,2] [--with-baseline] [--data-dir data]
        [--work-dir experiment-runs] [--dry-run]

Each seed trains every stage into WORK_DIR/NAME/seed-S (a later stage from the earlier one's
weights, in stage-N), all within the config's budget: a run still going then gets SIGTERM and
saves the step it reached. Then `cvae eval` scores the last stage with the config's flags into
eval.json, and the runner prints the medians over the seeds of the main figures. Runs go one at
a time: on 2 cores, two at once would time neither. `--dry-run` prints the commands only.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from experiments.configs import names

FIGURES = (  # (heading, path in cvae eval's JSON)
    ("-log p(x|y)", ("iwae", "nll_conditional")), ("-log p(x)", ("iwae", "nll_marginal")),
    ("sample acc.", ("fidelity", "samples", "accuracy")), ("FD", ("fidelity", "samples", "fd")),
    ("recall", ("fidelity", "samples", "recall")),
    ("q(y|x) err.", ("classification", "q_y_given_x", "error")))
STOP_GRACE_SECONDS = 300  # after SIGTERM: time to save the step reached


def load(name: str):
    if name not in names():
        raise SystemExit(f"unknown experiment {name!r}: allowed {', '.join(names())}")
    return importlib.import_module(f"experiments.configs.{name}")


def cvae(*args: str) -> list[str]:
    return [sys.executable, "-m", "cvae.cli", *args]


def commands(config, seed: int, run_dir: Path, data_dir: Path) -> list[list[str]]:
    """The `cvae train` command of each stage, then the `cvae eval` command."""
    result, previous = [], None
    for number, flags in enumerate(config.STAGES, start=1):
        stage_dir = run_dir if number == len(config.STAGES) else run_dir / f"stage-{number}"
        init = ["--init-from", str(previous)] if previous else []
        result.append(cvae("train", *flags, *init, "--seed", str(seed), "--data-dir",
                           str(data_dir), "--checkpoint-dir", str(stage_dir / "checkpoints"),
                           "--fresh", "--no-progress"))
        previous = stage_dir / "checkpoints"
    result.append(cvae("eval", *config.EVAL, "--checkpoint-dir", str(previous), "--data-dir",
                       str(data_dir), "--json", str(run_dir / "eval.json")))
    return result


def train(command: list[str], budget: float) -> bool:
    """One stage under what is left of the budget; True when it finished by itself."""
    process = subprocess.Popen(command)
    try:
        return process.wait(timeout=max(budget, 1.0)) == 0
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
        return False


def run_seed(config, seed: int, run_dir: Path, data_dir: Path) -> dict | None:
    *stages, evaluate = commands(config, seed, run_dir, data_dir)
    start, budget = time.monotonic(), 60.0 * config.BUDGET_MINUTES
    for stage in stages:
        if not train(stage, budget - (time.monotonic() - start)):
            break
    seconds = time.monotonic() - start
    if subprocess.run(evaluate).returncode != 0:
        return None
    return {"seconds": seconds, **json.loads((run_dir / "eval.json").read_text())}


def lookup(results: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(results, dict) or results.get(key) is None:
            return None
        results = results[key]
    return results


def summary(name: str, runs: list[dict]) -> str:
    cells = [f"{name}: {len(runs)} run(s)"]
    for heading, path in (("wall s", ("seconds",)), *FIGURES):
        values = [v for v in (lookup(run, path) for run in runs) if v is not None]
        if values:
            cells.append(f"{heading} {statistics.median(values):.4g}")
    return ", ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=names())
    parser.add_argument("--seeds", help="comma-separated (default: the config's)")
    parser.add_argument("--with-baseline", action="store_true",
                        help="run the config's BASELINE too, with the same seeds")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--work-dir", type=Path, default=Path("experiment-runs"))
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    config = load(args.name)
    todo = [args.name] + ([config.BASELINE] if args.with_baseline and config.BASELINE else [])
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(config.SEEDS)
    for name in todo:
        experiment, runs = load(name), []
        for seed in seeds:
            run_dir = args.work_dir / name / f"seed-{seed}"
            if args.dry_run:
                for command in commands(experiment, seed, run_dir, args.data_dir):
                    print(" ".join(command[2:]).replace("cvae.cli", "cvae", 1))
                continue
            result = run_seed(experiment, seed, run_dir, args.data_dir)
            if result is not None:
                runs.append(result)
        if not args.dry_run:
            print(summary(name, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
