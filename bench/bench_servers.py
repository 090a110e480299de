"""Which server and process manager to run the service under: measured, not guessed.

    python -m bench.bench_servers --checkpoint-dir checkpoints     # ~3 min on 2 cores

The same app (bench/baselines.py) under each candidate, with 1 and 2 worker processes, driven
by wrk at concurrency 64 on two routes: `/bench/fixed` (a constant PNG: what the server itself
costs) and `/sample?digit=7&n=16` (the real work). Candidates: uvicorn's own supervisor
(`uvicorn --workers`, httptools + uvloop), gunicorn's arbiter with uvicorn workers (what
`cvae serve` runs, service/server.py), and granian (Rust HTTP, its own workers) when it is
installed (`pip install granian`; not a dependency). The choice in docs/service-workers.md
cites this table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from bench.bench_service import free_port, running, wrk

ROUTES = {"fixed": "/bench/fixed", "sample": "/sample?digit=7&n=16"}
FACTORY = "bench.baselines:create_bench_app_from_env"


def commands(port: int, workers: int, checkpoint_dir: str) -> dict[str, list[str]]:
    python = sys.executable
    found = {
        "uvicorn supervisor": [python, "-m", "uvicorn", "--factory", FACTORY, "--port",
                               str(port), "--workers", str(workers), "--http", "httptools",
                               "--loop", "uvloop", "--no-access-log", "--log-level", "warning"],
        "gunicorn + uvicorn worker (cvae serve)": [
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    lines = [f"wrk, concurrency {args.concurrency}, {args.seconds} s per cell",
             "", "| server | workers | route | req/s | p99 ms | server CPU ms/req | errors |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for workers in (1, 2):
        for name in commands(0, workers, args.checkpoint_dir):
            port = free_port()
            command = commands(port, workers, args.checkpoint_dir)[name]
            env = {**os.environ, "CVAE_CHECKPOINT_DIR": args.checkpoint_dir}
            with running(command, port, workers, env) as pid:
                for route, path in ROUTES.items():
                    wrk(port, path, args.concurrency, 1.0, pid)  # warm-up
                    r = wrk(port, path, args.concurrency, args.seconds, pid)
                    lines.append(f"| {name} | {workers} | {route} | {r['rps']:,.0f} | "
                                 f"{r['p99_ms']:.1f} | {r['cpu_ms']:.3f} | {r['errors']} |")
                    print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
