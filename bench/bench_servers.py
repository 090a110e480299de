"""Which server and process manager to run the service under: measured, not guessed.

    python -m bench.bench_servers --checkpoint-dir checkpoints     # ~3 min on 2 cores

The same app (bench/baselines.py) under each candidate, with 1 and 2 worker processes, driven
by wrk at concurrency 64 on two routes: `/bench/fixed` (a constant PNG: what the server itself
costs) and `/sample?digit=7&n=16` (the real work). For each worker count the candidates run side
by side and every (candidate, route) cell runs once per round, in `--rounds` interleaved rounds
(bench/rounds.py): figures are medians over rounds, and each candidate's ratio to `cvae serve`'s
server is the median of the per-round ratios. Candidates: uvicorn's own supervisor
(`uvicorn --workers`, httptools + uvloop), gunicorn's arbiter with uvicorn workers (what
`cvae serve` runs, service/server.py), and granian (Rust HTTP, its own workers) when it is
installed (`pip install granian`; not a dependency). The choice in docs/service-workers.md
cites this table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import statistics
import sys

from bench.machine import measured_machine
from bench.rounds import RATIO_RULE, interleaved, median_ratio
from bench.servers import free_port, running, wrk

ROUTES = {"fixed": "/bench/fixed", "sample": "/sample?digit=7&n=16"}
FACTORY = "bench.baselines:create_bench_app_from_env"
CHOSEN = "gunicorn + uvicorn worker (cvae serve)"  # the ratios' baseline


def commands(port: int, workers: int, checkpoint_dir: str) -> dict[str, list[str]]:
    python = sys.executable
    found = {
        "uvicorn supervisor": [python, "-m", "uvicorn", "--factory", FACTORY, "--port",
                               str(port), "--workers", str(workers), "--http", "httptools",
                               "--loop", "uvloop", "--no-access-log", "--log-level", "warning"],
        CHOSEN: [
            python, "-m", "bench.bench_service", "--serve", "--checkpoint-dir", checkpoint_dir,
            "--port", str(port), "--workers", str(workers)],
    }
    if shutil.which("granian") or _importable("granian"):
        found["granian"] = [python, "-m", "granian", "--interface", "asgi", "--factory",
                            "--port", str(port), "--workers", str(workers), "--loop", "uvloop",
                            "--no-ws", "--log-level", "warning", FACTORY]
    return found


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def measure(workers: int, checkpoint_dir: str, seconds: float, concurrency: int,
            rounds: int) -> dict[tuple[str, str], list[dict]]:
    """{(candidate, route): wrk figures per round}, all candidates with `workers` workers up at
    once."""
    env = {**os.environ, "CVAE_CHECKPOINT_DIR": checkpoint_dir}
    cells = {}
    with contextlib.ExitStack() as stack:
        for name in commands(0, workers, checkpoint_dir):
            port = free_port()
            pid = stack.enter_context(running(commands(port, workers, checkpoint_dir)[name],
                                              port, workers, env))
            for route, path in ROUTES.items():
                wrk(port, path, concurrency, 1.0, pid)  # warm-up
                cells[name, route] = functools.partial(wrk, port, path, concurrency, seconds, pid)
        return interleaved(cells, rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    tag = measured_machine().tag
    ratios = [f"wrk, concurrency {args.concurrency}, {args.seconds} s per cell, {args.rounds} "
              f"interleaved rounds; ratios: {RATIO_RULE}.", "",
              f"| server | workers | route | req/s vs {CHOSEN} |", "|---|---:|---|---:|"]
    absolute = [f"Absolute figures on `{tag}` (medians over the rounds):", "",
                "| server | workers | route | req/s | p99 ms | server CPU ms/req | errors |",
                "|---|---:|---|---:|---:|---:|---:|"]
    for workers in (1, 2):
        runs = measure(workers, args.checkpoint_dir, args.seconds, args.concurrency, args.rounds)
        for (name, route), results in runs.items():
            ratio = median_ratio([r["rps"] for r in results],
                                 [r["rps"] for r in runs[CHOSEN, route]])
            ratios.append(f"| {name} | {workers} | {route} | {ratio:.2f}x |")
            median = {key: statistics.median(r[key] for r in results)
                      for key in ("rps", "p99_ms", "cpu_ms")}
            absolute.append(f"| {name} | {workers} | {route} | {median['rps']:,.0f} | "
                            f"{median['p99_ms']:.1f} | {median['cpu_ms']:.3f} | "
                            f"{sum(r['errors'] for r in results)} |")
            print(absolute[-1], file=sys.stderr, flush=True)
    print("\n".join(ratios + [""] + absolute))
    return 0


if __name__ == "__main__":
    sys.exit(main())
