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
import dataclasses
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

ENDPOINTS = {
    "batched": "/sample?digit=7&n=16",
    "unbatched": "/bench/unbatched?digit=7&n=16",
    "fixed": "/bench/fixed",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class ServerProcess:
    """A server subprocess listening on 127.0.0.1:`port`."""

    process: subprocess.Popen
    port: int
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""


@contextlib.contextmanager
def server_process(command: list[str], port: int, log_path: Path | None = None,
                   timeout: float = 180.0):
    """Runs `command` (a server that will listen on 127.0.0.1:`port`), yields a `ServerProcess`
    once `/readyz` answers 200, and stops it (SIGTERM, then SIGKILL after 20 s) on exit.
    Output goes to `log_path` when given (else inherited)."""
    if log_path is not None:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    else:
        process = subprocess.Popen(command)
    running = ServerProcess(process, port, log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with code {process.returncode}:\n"
                                   f"{running.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready within {timeout} s:\n{running.log()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{running.url}/readyz", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def cvae_serve_command(checkpoint_dir: str | Path, port: int, *extra: str) -> list[str]:
    """The real service: `cvae serve` on 127.0.0.1:`port`."""
    return [sys.executable, "-m", "cvae.cli", "serve", "--checkpoint-dir", str(checkpoint_dir),
            "--host", "127.0.0.1", "--port", str(port), *extra]


@contextlib.contextmanager
def server(checkpoint_dir: str, timeout: float = 180.0):
    """The service with its bench routes, access log off; yields the port."""
    port = free_port()
    command = [sys.executable, "-m", "bench.bench_service", "--serve",
               "--checkpoint-dir", checkpoint_dir, "--port", str(port)]
    with server_process(command, port, timeout=timeout):
        yield port


def serve(checkpoint_dir: str, port: int) -> None:
    import uvicorn

    from service.app import create_app

    uvicorn.run(create_app(checkpoint_dir, bench_routes=True), host="127.0.0.1", port=port,
                access_log=False, log_level="warning")


# ---- the load generator --------------------------------------------------------------------


@dataclasses.dataclass
class Reply:
    """One request's outcome. status 0: no HTTP answer (`error` says why)."""

    path: str
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    seconds: float
    connection: int = 0  # which of the load generator's connections sent it
    error: str | None = None


async def connection_loop(port: int, next_path: str | Callable[[], str], stop_at: float,
                          budget: list[int], on_reply: Callable[[Reply], None],
                          connection: int = 0, timeout: float = 60.0) -> None:
    """One keep-alive HTTP/1.1 connection sending GETs back to back until `stop_at`
    (perf_counter) or until the shared `budget` (a one-element list) is spent. `next_path` is
    the path, or a function giving each request's path. Reconnects after an error or a
    `Connection: close`; each request waits at most `timeout` s for its answer."""
    reader = writer = None
    while time.perf_counter() < stop_at and budget[0] > 0:
        budget[0] -= 1
        path = next_path() if callable(next_path) else next_path
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        started = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            head, body = await asyncio.wait_for(read_response(reader), timeout)
            status = int(head[9:12])
            headers = parse_headers(head)
            if headers.get("connection", "").lower() == "close":
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError,
                IndexError, KeyError) as error:
            on_reply(Reply(path, 0, {}, b"", time.perf_counter() - started, connection,
                           repr(error)))
            if writer is not None:
                writer.close()
            writer = None
            continue
        on_reply(Reply(path, status, headers, body, time.perf_counter() - started, connection))
    if writer is not None:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(parse_headers(head)["content-length"])
    return head, await reader.readexactly(length)


def parse_headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return {name.strip().lower(): value.strip() for name, value in pairs}


async def drive(port: int, next_path: str | Callable[[], str], concurrency: int, seconds: float,
                max_requests: int, on_reply: Callable[[Reply], None]) -> float:
    """`concurrency` connections for at most `seconds` and `max_requests` in all; returns the
    elapsed seconds."""
    started = time.perf_counter()
    stop_at = started + seconds
    budget = [max_requests]
    await asyncio.gather(*(connection_loop(port, next_path, stop_at, budget, on_reply, i)
                           for i in range(concurrency)))
    return time.perf_counter() - started


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def load(port: int, path: str, concurrency: int, seconds: float, max_requests: int) -> dict:
    latencies, errors = [], []

    def record(reply: Reply) -> None:
        if reply.status == 200:
            latencies.append(reply.seconds)
        else:
            errors.append(reply.error or f"HTTP {reply.status}")

    elapsed = await drive(port, path, concurrency, seconds, max_requests, record)
    latencies.sort()
    return {"requests": len(latencies), "rps": len(latencies) / elapsed,
            "p50_ms": quantile(latencies, 0.5) * 1000, "p99_ms": quantile(latencies, 0.99) * 1000,
            "errors": len(errors), "error_examples": errors[:3]}


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
