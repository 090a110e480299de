"""Load test of `GET /sample` against a real server on loopback, with in-run baselines.

    python -m bench.bench_service --checkpoint-dir checkpoints        # ~2.5 min on 2 cores
    python -m bench.bench_service --checkpoint-dir checkpoints --quick # seconds; smoke only

Starts the service (`create_app(..., bench_routes=True)` under uvicorn, access log off) in a
subprocess on a free 127.0.0.1 port and drives it with a closed-loop load generator: C
keep-alive HTTP/1.1 connections (raw asyncio streams, so the client costs little CPU), each
sending its next request as soon as the previous answer arrived, for a fixed time and at most a
fixed count. Three endpoints are measured at each concurrency, interleaved and repeated (the
table shows medians over the repeats):

- `batched`: `/sample?digit=7&n=16`, the real endpoint (dynamic batching);
- `unbatched`: the same picture from a plain `def` route, one decode per request in FastAPI's
  threadpool (what a straightforward implementation does);
- `fixed`: a constant PNG of the same size: the framework's ceiling on this machine.

Results are ratios against `fixed` measured in the same run, so they transfer across machines
better than absolute numbers. The issue's target at concurrency 64: batched >= 0.5x the ceiling's
requests/s, p99 <= 50 ms, no errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ENDPOINTS = {
    "batched": "/sample?digit=7&n=16",
    "unbatched": "/bench/unbatched?digit=7&n=16",
    "fixed": "/bench/fixed",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(checkpoint_dir: str, timeout: float = 180.0):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench.bench_service", "--serve",
                                "--checkpoint-dir", checkpoint_dir, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise SystemExit(f"server exited with code {process.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"server not ready within {timeout} s")
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def serve(checkpoint_dir: str, port: int) -> None:
    import uvicorn

    from service.app import create_app

    uvicorn.run(create_app(checkpoint_dir, bench_routes=True), host="127.0.0.1", port=port,
                access_log=False, log_level="warning")


# ---- the load generator --------------------------------------------------------------------


async def connection_loop(port: int, path: str, stop_at: float, budget: list[int],
                          latencies: list[float], errors: list[str]) -> None:
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    reader = writer = None
    while time.perf_counter() < stop_at and budget[0] > 0:
        budget[0] -= 1
        started = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            headers = head.decode("latin-1").lower()
            length = int(headers.split("content-length:", 1)[1].split("\r\n", 1)[0])
            await reader.readexactly(length)
            if "connection: close" in headers:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as error:
            errors.append(repr(error))
            writer = None
            continue
        if status == 200:
            latencies.append(time.perf_counter() - started)
        else:
            errors.append(f"HTTP {status}")
    if writer is not None:
        writer.close()


async def load(port: int, path: str, concurrency: int, seconds: float, max_requests: int) -> dict:
    budget, latencies, errors = [max_requests], [], []
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(connection_loop(port, path, stop_at, budget, latencies, errors)
                           for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()

    def quantile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies \
            else float("nan")

    return {"requests": len(latencies), "rps": len(latencies) / elapsed, "p50_ms": quantile(0.5),
            "p99_ms": quantile(0.99), "errors": len(errors), "error_examples": errors[:3]}


def measure(port: int, concurrencies: list[int], seconds: float, max_requests: int,
            repeats: int, warmup: float) -> list[dict]:
    rows = []
    for concurrency in concurrencies:
        runs = {name: [] for name in ENDPOINTS}
        for name, path in ENDPOINTS.items():  # warm every endpoint at this concurrency
            asyncio.run(load(port, path, concurrency, warmup, max_requests))
        for _ in range(repeats):
            for name, path in ENDPOINTS.items():
                runs[name].append(asyncio.run(load(port, path, concurrency, seconds,
                                                   max_requests)))
        for name, results in runs.items():
            rows.append({"concurrency": concurrency, "endpoint": name, "repeats": repeats,
                         **{key: statistics.median(r[key] for r in results)
                            for key in ("rps", "p50_ms", "p99_ms")},
                         "requests": sum(r["requests"] for r in results),
                         "errors": sum(r["errors"] for r in results),
                         "error_examples": [e for r in results for e in r["error_examples"]][:3]})
    return rows


def table(rows: list[dict]) -> str:
    ceiling = {r["concurrency"]: r["rps"] for r in rows if r["endpoint"] == "fixed"}
    lines = ["| concurrency | endpoint | req/s | p50 ms | p99 ms | errors | req/s vs fixed |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['endpoint']} | {r['rps']:.0f} | "
                     f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | "
                     f"{r['rps'] / ceiling[r['concurrency']]:.2f} |")
    by = {(r["concurrency"], r["endpoint"]): r for r in rows}
    for concurrency in sorted(ceiling):
        batched, unbatched = by[concurrency, "batched"], by[concurrency, "unbatched"]
        lines.append(f"\nconcurrency {concurrency}: batched/unbatched req/s = "
                     f"{batched['rps'] / unbatched['rps']:.1f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated levels")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--max-requests", type=int, default=50_000, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds per endpoint/level")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.checkpoint_dir, args.port)
        return 0
    if args.quick:
        args.seconds, args.max_requests, args.repeats, args.warmup = 0.5, 40, 1, 0.2
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    with server(args.checkpoint_dir) as port:
        rows = measure(port, concurrencies, args.seconds, args.max_requests, args.repeats,
                       args.warmup)
    print(f"GET /sample?digit=7&n=16, checkpoint dir {args.checkpoint_dir}, "
          f"{args.seconds} s x {args.repeats} repeats per cell (medians)\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
