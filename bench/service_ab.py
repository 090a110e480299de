"""The service as changed against the service as it was: two servers side by side, one worker
each, serving one checkpoint, with wrk rounds interleaved (bench/rounds.py).

    python -m bench.service_ab --checkpoint-dir CKPT [--base HEAD] [--rounds 5] [--seconds 8]
        [--concurrency 64] [--path "/sample?digit=7&n=16"]

"As it was" is a git revision (`--base`), checked out detached into a temporary worktree and
removed at the end; "as changed" is the working tree. Each server runs bench.bench_service's
app in its own tree (its working directory, so `service`, `cvae` and `bench` are imported from
there). Prints every round, then each side's medians and the median over rounds of the
per-round ratio (changed / base). This is how the service's levers were measured: the
machine's speed drifts by 20-30% within minutes, so only rounds run seconds apart compare.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.rounds import RATIO_RULE, interleaved, median_ratio
from bench.bench_service import ENDPOINTS, bench_server
from bench.servers import wrk

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("rps", "p50_ms", "p99_ms", "cpu_ms")
WARMUP_SECONDS = 2.0


@contextlib.contextmanager
def worktree(revision: str, repository: Path = ROOT) -> Iterator[Path]:
    """`revision` checked out (detached) in a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="cvae-ab-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(repository), "worktree", "add", "--detach", "--quiet",
                        str(tree), revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(repository), "worktree", "remove", "--force",
                            str(tree)], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0, help="per wrk run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--path", default=ENDPOINTS["project"])
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("service_ab: wrk is not installed (`apt-get install wrk`)", file=sys.stderr)
        return 2
    with worktree(args.base) as base_tree, contextlib.ExitStack() as stack:
        servers = {"base": stack.enter_context(bench_server(args.checkpoint_dir, 1,
                                                            str(base_tree))),
                   "changed": stack.enter_context(bench_server(args.checkpoint_dir, 1,
                                                               str(ROOT)))}

        def measure(name: str):
            port, pid = servers[name]
            figures = wrk(port, args.path, args.concurrency, args.seconds, pid)
            print(f"{name:8s} " + "  ".join(f"{key} {figures[key]:.3f}" for key in FIGURES),
                  flush=True)
            return figures

        for port, pid in servers.values():
            wrk(port, args.path, args.concurrency, WARMUP_SECONDS, pid)
        results = interleaved({name: (lambda name=name: measure(name)) for name in servers},
                              args.rounds)
    for name, runs in results.items():
        print(f"median {name:8s} " + "  ".join(
            f"{key} {statistics.median(run[key] for run in runs):.3f}" for key in FIGURES))
    for key in ("rps", "p99_ms"):
        ratio = median_ratio([run[key] for run in results["changed"]],
                             [run[key] for run in results["base"]])
        print(f"changed / base, {key}: {ratio:.3f} ({RATIO_RULE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
