"""Servers on loopback and wrk runs against them, for the service benchmarks.

    with running(command, port, workers) as pid:      # once /readyz answered from every worker
        figures = wrk(port, "/sample?digit=7&n=16", 64, 5.0, pid)   # req/s, p50/p99, CPU/req

Server CPU per request is the CPU time (user + system) of the server's processes, from /proc,
over the requests wrk completed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_tree(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            kids = [int(child) for child in listing.read().split()]
    except OSError:
        return []
    return [pid, *(p for kid in kids for p in process_tree(kid))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and its descendants (the workers), from /proc."""
    total = 0
    for process in process_tree(pid):
        try:
            with open(f"/proc/{process}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        except OSError:
            pass
    return total * CLOCK_TICK_S


def settle(pid: int, idle_share: float = 0.1, interval: float = 0.2,
           timeout: float = 10.0) -> None:
    """Waits until the server uses under `idle_share` of a core, so that the requests wrk left
    in flight when it stopped (a backlog of up to `concurrency` of them) are charged to the run
    that sent them, not to the next one's CPU and tail latency."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(interval)
        if cpu_seconds(pid) - before < idle_share * interval:
            return


def quiesce(pid: int, quiet: float = 2.0, timeout: float = 600.0) -> float:
    """Waits until the server has used under a tenth of a core over `quiet` seconds, e.g. while
    a worker's checkpoint thread still checks the decode block sizes that start-up left
    (service/checkpoints.py, `finish_checks`): those compile for seconds to minutes after
    /readyz first answers, on the same cores. Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        before = cpu_seconds(pid)
        time.sleep(quiet)
        if cpu_seconds(pid) - before < 0.1 * quiet:
            break
    return time.monotonic() - started


@contextlib.contextmanager
def running(command: list[str], port: int, workers: int, env: dict | None = None,
            timeout: float = 300.0, stdout=subprocess.DEVNULL, cwd: str | None = None):
    """Runs a server `command` (its own process group, in `cwd`) that listens on
    127.0.0.1:`port`; yields its pid once /readyz has answered from `workers` different worker
    processes. `stdout`: where its output goes (both streams; default nowhere)."""
    process = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True,
                               stdout=stdout, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while len(seen) < workers:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[:4]} with {workers} workers did not start")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    seen.add(json.load(r)["pid"])
            except OSError:
                time.sleep(0.2)
        yield process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# ---- wrk -----------------------------------------------------------------------------------


UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(number) * UNITS_MS[unit]


def wrk(port: int, path: str, concurrency: int, seconds: float, server_pid: int,
        script: str | None = None) -> dict:
    """One wrk run (`script`: a wrk Lua script, e.g. `post_script`'s); returns req/s, p50/p99
    ms, errors and server CPU ms per request."""
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",  # whole s
               "--latency", "--timeout", "10s", *(["-s", script] if script else []),
               f"http://127.0.0.1:{port}{path}"]
    cpu_before = cpu_seconds(server_pid)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    settle(server_pid)
    cpu = cpu_seconds(server_pid) - cpu_before
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors += int(non_2xx.group(1)) if non_2xx else 0
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.MULTILINE))
    if set(latency) != {"50", "99"}:  # wrk prints no distribution when nothing completed
        raise RuntimeError(f"wrk measured no latencies for {path}:\n{out}")
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": _ms(latency["50"]), "p99_ms": _ms(latency["99"]), "errors": errors,
            "requests": requests, "cpu_ms": cpu * 1000 / max(requests, 1)}
