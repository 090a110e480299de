"""Load test of `GET /sample` against the real server on loopback, with in-run baselines.

    python -m bench.bench_service --checkpoint-dir checkpoints           # ~3 min on 2 cores
    python -m bench.bench_service --checkpoint-dir checkpoints --quick   # seconds; smoke only

For each worker count (1 and 2) it starts `cvae serve`'s server (service/server.py: gunicorn,
uvicorn workers, httptools, uvloop, access log off) with the app of bench/baselines.py, and
drives it with wrk (a C load generator, so the client costs little of the 2 cores; `make bench`
installs Debian's wrk when it is missing): C keep-alive connections, closed loop, for a fixed
time. The servers for every worker count run side by side, and at each concurrency every
(worker count, endpoint) cell runs once per round, in interleaved rounds (bench/rounds.py):
figures are medians over rounds, ratios (project vs plain, 2 workers vs 1) medians of per-round
ratios. Three endpoints:

- `project`: `/sample?digit=7&n=16`, the real endpoint (continuous batching);
- `plain`: the same picture from a plain per-request `async def` route that decodes inline;
- `fixed`: a constant PNG of the same size: the framework's ceiling on this machine.

Then, at concurrency 8 (`TRANSFER_CONCURRENCY`), `POST /transfer?show_input=true` with a
280x280 PNG drawing (what the page's canvas sends) interleaved with the same `/sample` request:
the style-transfer route (upload read, image prepared in a thread, encoder and decoder batched)
beside the sampling one.

Server CPU per request is the CPU time (user + system) of the server's processes, from
/proc, over the requests wrk completed (bench/servers.py). The issue's targets are checked in
the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import measured_machine
from bench.rounds import RATIO_RULE, interleaved, median_ratio
from bench.servers import free_port, process_tree, quiesce, running, wrk

ENDPOINTS = {
    "project": "/sample?digit=7&n=16",
    "plain": "/bench/plain?digit=7&n=16",
    "fixed": "/bench/fixed",
}
TRANSFER_PATH = "/transfer?show_input=true"
TRANSFER_CONCURRENCY = 8
TARGETS = {"x_plain": 5.0, "p99_ms": 50.0, "cpu_ms": 0.6, "scaling": 1.8}


@contextlib.contextmanager
def bench_server(checkpoint_dir: str, workers: int, source: str | None = None):
    """The bench app under `cvae serve`'s server; yields (port, pid) once every worker is
    ready and idle: a worker answers once one decode block size is compiled and checks the
    others in the background, which would otherwise run during the first measurements.
    `source`: the source tree it runs from (its working directory; bench/service_ab.py serves
    a git revision's), else this one."""
    port = free_port()
    command = [sys.executable, "-m", "bench.bench_service", "--serve", "--checkpoint-dir",
               os.path.abspath(checkpoint_dir), "--port", str(port), "--workers", str(workers)]
    with running(command, port, workers, cwd=source) as pid:
        quiesce(pid)
        yield port, pid


def serve(checkpoint_dir: str, port: int, workers: int) -> None:
    from service.server import lazy_app, serve as run_server

    run_server(lazy_app("bench.baselines:create_bench_app", checkpoint_dir), "127.0.0.1", port,
               workers=workers, access_log=False, log_level="warning")


def drawing_png() -> bytes:
    """A 280x280 PNG of a hand-drawn-looking 7, black on white: what the page's canvas sends."""
    import io

    from PIL import Image, ImageDraw

    image = Image.new("L", (280, 280), 255)
    ImageDraw.Draw(image).line([(100, 40), (190, 40), (120, 250)], fill=0, width=20)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def post_script(directory: str, body: bytes) -> str:
    """A wrk Lua script that POSTs `body` as image/png; returns its path."""
    body_path, script_path = Path(directory) / "body.png", Path(directory) / "post.lua"
    body_path.write_bytes(body)
    script_path.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "image/png"\n'
                           f'local f = assert(io.open("{body_path}", "rb"))\n'
                           f'wrk.body = f:read("*a")\nf:close()\n')
    return str(script_path)


def measure_level(servers: dict[int, tuple[int, int]], concurrency: int, calls: dict,
                  seconds: float, repeats: int, warmup: float, log=print) -> list[dict]:
    """`calls` ({name: (path, wrk script or None)}) at one concurrency on every server
    ({workers: (port, pid)}): each cell warmed, then `repeats` interleaved rounds of all cells;
    one row per (workers, name) with medians and the per-round req/s."""
    cells = {(workers, name): functools.partial(wrk, port, path, concurrency, seconds, pid, script)
             for workers, (port, pid) in servers.items()
             for name, (path, script) in calls.items()}
    for workers, (port, pid) in servers.items():
        for path, script in calls.values():
            wrk(port, path, concurrency, warmup, pid, script)
    rows = []
    for (workers, name), results in interleaved(cells, repeats).items():
        row = {"workers": workers, "concurrency": concurrency, "endpoint": name,
               "repeats": repeats, **{key: statistics.median(r[key] for r in results)
                                      for key in ("rps", "p50_ms", "p99_ms", "cpu_ms")},
               "rps_rounds": [r["rps"] for r in results],
               "requests": sum(r["requests"] for r in results),
               "errors": sum(r["errors"] for r in results)}
        rows.append(row)
        log(f"workers {workers} c={concurrency} {name}: {row['rps']:.0f} req/s, "
            f"p99 {row['p99_ms']:.1f} ms, {row['cpu_ms']:.3f} ms CPU/req")
    return rows


def measure(checkpoint_dir: str, workers_list: list[int], concurrencies: list[int],
            seconds: float, repeats: int, warmup: float, log=print,
            transfer_script: str | None = None) -> list[dict]:
    """ENDPOINTS at each concurrency, then (with `transfer_script`) /transfer beside /sample
    at TRANSFER_CONCURRENCY, on one server per worker count, all running side by side."""
    sampling = {name: (path, None) for name, path in ENDPOINTS.items()}
    transfer = {"sample": (ENDPOINTS["project"], None), "transfer": (TRANSFER_PATH,
                                                                    transfer_script)}
    rows = []
    with contextlib.ExitStack() as stack:
        servers = {workers: stack.enter_context(bench_server(checkpoint_dir, workers))
                   for workers in workers_list}
        for concurrency in concurrencies:
            rows += measure_level(servers, concurrency, sampling, seconds, repeats, warmup, log)
        if transfer_script is not None:
            rows += measure_level(servers, TRANSFER_CONCURRENCY, transfer, seconds, repeats,
                                  warmup, log)
    return rows


# ---- the decode alone ------------------------------------------------------------------------


def decode_cost(checkpoint_dir: str, calls: int = 300) -> str:
    """CPU per lone 16-digit request's latents + decode (what concurrency 1 pays), back to back
    and with 5 ms pauses between calls, in this process: the pauses show XLA's CPU thread pool
    spinning while it waits for work."""
    from cvae.sampling.sampler import load_sampler
    from cvae.sampling.latents import LatentRequest, batch_latents

    sampler = load_sampler(checkpoint_dir)
    request = [LatentRequest(3, (7,), 16, 1.0)]
    costs = {}
    for pause in (0.0, 0.005):
        sampler.decode(*batch_latents(request, sampler.noise_dim)[0])
        started = time.process_time()
        for _ in range(calls):
            sampler.decode(*batch_latents(request, sampler.noise_dim)[0])
            time.sleep(pause)
        costs[pause] = (time.process_time() - started) / calls * 1000
    return (f"A lone 16-digit request's latents + decode (one 64-row block) in-process: "
            f"{costs[0.0]:.2f} ms of CPU per call back to back, {costs[0.005]:.2f} ms with 5 ms "
            f"pauses between calls ({calls} calls each).")


# ---- profile -------------------------------------------------------------------------------


def profile(checkpoint_dir: str, seconds: float, concurrency: int = 64, top: int = 14) -> str:
    """py-spy (`--gil`: only the thread holding the GIL, i.e. Python work) on the one worker of
    a 1-worker server while wrk drives `/sample`: where the Python time goes, as markdown."""
    if shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists():
        return "_py-spy is not installed (it is in the dev extra)._"
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with bench_server(checkpoint_dir, 1) as (port, pid):
        worker = process_tree(pid)[1]
        wrk(port, ENDPOINTS["project"], concurrency, 1.0, pid)  # warm
        raw = Path(f"/tmp/cvae-pyspy-{worker}.txt")
        spy = subprocess.Popen([py_spy, "record", "--gil", "--nonblocking", "-r", "250", "-f",
                                "raw", "-d", str(int(seconds)), "-o", str(raw), "-p",
                                str(worker)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        wrk(port, ENDPOINTS["project"], concurrency, seconds + 1, pid)
        spy.wait(60)
    stacks = [line.rsplit(" ", 1) for line in raw.read_text().splitlines() if line.strip()]
    raw.unlink()
    total = sum(int(n) for _, n in stacks)
    by_package: dict[str, int] = {}
    by_function: dict[str, int] = {}
    for stack, n in stacks:
        leaf = stack.split(";")[-1]
        by_package[_package(leaf)] = by_package.get(_package(leaf), 0) + int(n)
        by_function[_frame(leaf)] = by_function.get(_frame(leaf), 0) + int(n)
    lines = [f"py-spy `--gil` on the worker of a 1-worker server at c={concurrency}, {total} "
             "samples of the thread holding the GIL (Python work, and the system calls made "
             "while holding it), by where the sampled line is:", "",
             "| share | package |", "|---:|---|"]
    lines += [f"| {n / total:.0%} | {name} |" for name, n in
              sorted(by_package.items(), key=lambda item: -item[1])]
    lines += ["", "| share | function (self) |", "|---:|---|"]
    lines += [f"| {n / total:.1%} | `{name}` |" for name, n in
              sorted(by_function.items(), key=lambda item: -item[1])[:top]]
    return "\n".join(lines)


def _frame(frame: str) -> str:
    """'name (path/to/module.py:123)' -> 'name (module.py:123)'."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')')).name})" if where else name


PACKAGES = ("uvicorn", "starlette", "fastapi", "pydantic", "prometheus_client", "numpy", "jax",
            "asyncio", "concurrent", "service", "cvae", "gunicorn", "uvloop", "httptools")


def _package(frame: str) -> str:
    where = frame.partition(" (")[2]
    parts = Path(where.split(":")[0]).parts
    return next((part for part in parts if part in PACKAGES), "other (stdlib, C)")


# ---- report --------------------------------------------------------------------------------


def rps_ratio(a: dict, b: dict) -> float:
    """Req/s of row `a` over row `b`: the median of their per-round ratios."""
    return median_ratio(a["rps_rounds"], b["rps_rounds"])


def absolute_table(rows: list[dict]) -> str:
    """Req/s, latency, CPU and errors of each row."""
    lines = ["| workers | concurrency | endpoint | req/s | p50 ms | p99 ms | server CPU ms/req | "
             "errors |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['workers']} | {r['concurrency']} | {r['endpoint']} | {r['rps']:,.0f} | "
              f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['cpu_ms']:.3f} | {r['errors']} |"
              for r in rows]
    return "\n".join(lines)


def transfer_table(rows: list[dict]) -> str:
    """The TRANSFER_CONCURRENCY rows' ratios: /transfer against /sample, per worker count."""
    by = {(r["workers"], r["endpoint"]): r for r in rows}
    lines = [f"| workers | req/s of /transfer vs /sample (c={TRANSFER_CONCURRENCY}) |",
             "|---:|---:|"]
    lines += [f"| {w} | {rps_ratio(by[w, 'transfer'], by[w, 'sample']):.2f}x |"
              for w in sorted({r["workers"] for r in rows})]
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """The ratios of each row's req/s: against plain and fixed on the same server and
    concurrency, and against the same endpoint on the server with the fewest workers."""
    by = {(r["workers"], r["concurrency"], r["endpoint"]): r for r in rows}
    fewest = min(r["workers"] for r in rows)
    lines = ["| workers | concurrency | endpoint | vs plain | vs fixed | "
             f"vs {fewest} worker(s) |", "|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        w, c = r["workers"], r["concurrency"]
        scaling = ("" if w == fewest
                   else f"{rps_ratio(r, by[fewest, c, r['endpoint']]):.2f}x")
        lines.append(f"| {w} | {c} | {r['endpoint']} | {rps_ratio(r, by[w, c, 'plain']):.2f}x | "
                     f"{rps_ratio(r, by[w, c, 'fixed']):.2f}x | {scaling} |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> str:
    """The serving issue's targets, for the project endpoint, from this run."""
    by = {(r["workers"], r["concurrency"], r["endpoint"]): r for r in rows}
    workers = sorted({r["workers"] for r in rows})
    top = max(r["concurrency"] for r in rows)
    checks = []
    for w in workers:
        project, plain = by[w, top, "project"], by[w, top, "plain"]
        x_plain = rps_ratio(project, plain)
        checks += [
            (f"{w} worker(s), c={top}: req/s >= {TARGETS['x_plain']:.0f}x plain",
             f"{x_plain:.2f}x", x_plain >= TARGETS["x_plain"]),
            (f"{w} worker(s), c={top}: p99 <= {TARGETS['p99_ms']:.0f} ms",
             f"{project['p99_ms']:.1f} ms", project["p99_ms"] <= TARGETS["p99_ms"]),
            (f"{w} worker(s), c={top}: server CPU <= {TARGETS['cpu_ms']} ms/request",
             f"{project['cpu_ms']:.3f} ms", project["cpu_ms"] <= TARGETS["cpu_ms"])]
    if len(workers) > 1:
        gain = rps_ratio(by[workers[-1], top, "project"], by[workers[0], top, "project"])
        checks.append((f"{workers[-1]} workers >= {TARGETS['scaling']}x the req/s of "
                       f"{workers[0]} (c={top})", f"{gain:.2f}x", gain >= TARGETS["scaling"]))
    errors = sum(r["errors"] for r in rows)
    checks.append(("0 errors", str(errors), errors == 0))
    lines = ["| target | measured | met |", "|---|---:|---|"]
    lines += [f"| {name} | {value} | {'yes' if met else '**no**'} |" for name, value, met in checks]
    return "\n".join(lines)


def report(sampling: list[dict], transfers: list[dict], seconds: float, repeats: int,
           checkpoint_dir: str, tag: str) -> str:
    """The section: ratios first, then the absolute figures under the machine's tag."""
    return "\n".join([
        f"`GET {ENDPOINTS['project']}`, checkpoint dir {checkpoint_dir}, wrk, {seconds} s per "
        f"cell, {repeats} interleaved rounds of every (workers, endpoint) cell; ratios: "
        f"{RATIO_RULE}.", "", table(sampling), "",
        f"Style transfer: `POST {TRANSFER_PATH}` with a 280x280 PNG drawing, in the same kind of "
        f"rounds with `GET {ENDPOINTS['project']}`:", "", transfer_table(transfers), "",
        f"Targets (p99 and CPU are absolute figures on `{tag}`):", "", targets(sampling), "",
        f"Absolute figures on `{tag}` (medians over the rounds):", "",
        absolute_table(sampling), "", "Style transfer, the same way:", "",
        absolute_table(transfers)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--concurrency", default="1,64", help="comma-separated levels")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds per endpoint/level")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--no-transfer", action="store_true",
                        help="skip the /transfer cells (at c=8)")
    parser.add_argument("--profile", type=float, default=10.0, metavar="SECONDS",
                        help="py-spy profile of one worker under load (0: skip)")
    parser.add_argument("--machine-tag", help="the machine's tag (bench.run passes its own); "
                        "measured here when absent")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.checkpoint_dir, args.port, int(args.workers))
        return 0
    if shutil.which("wrk") is None:
        print("bench_service: wrk is not installed (`apt-get install wrk`; `make bench` does "
              "it)", file=sys.stderr)
        return 2
    if args.quick:
        args.seconds, args.repeats, args.warmup = 1.0, 1, 1.0
    tag = args.machine_tag or measured_machine().tag
    with tempfile.TemporaryDirectory(prefix="cvae-bench-transfer-") as scratch:
        rows = measure(args.checkpoint_dir, [int(w) for w in args.workers.split(",")],
                       [int(c) for c in args.concurrency.split(",")], args.seconds,
                       args.repeats, args.warmup,
                       log=lambda m: print(m, file=sys.stderr, flush=True),
                       transfer_script=(None if args.no_transfer
                                        else post_script(scratch, drawing_png())))
    sampling = [r for r in rows if r["endpoint"] in ENDPOINTS]
    transfers = [r for r in rows if r["endpoint"] not in ENDPOINTS]
    print(report(sampling, transfers, args.seconds, args.repeats, args.checkpoint_dir, tag))
    if args.profile and not args.quick:
        print("\n" + decode_cost(args.checkpoint_dir))
        print("\n" + profile(args.checkpoint_dir, args.profile))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
