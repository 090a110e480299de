"""Soak of a real `cvae serve --workers 2` (`make soak` runs it longer): mixed load, checkpoints
changing under load, slow and abandoned clients. Traffic only to 127.0.0.1.

Durations: CVAE_SOAK_SECONDS (default 6), CVAE_CHURN_SECONDS (default 8; the churn runs on, up
to 3x, until the server has served a newer step)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

import httpx
import pytest

import service_checks
from servers import cvae_server

pytestmark = pytest.mark.slow

READ_TIMEOUT, WRITE_TIMEOUT = 2.0, 3.0
WORKERS = 2
SOAK_SECONDS = float(os.environ.get("CVAE_SOAK_SECONDS", 6))
CHURN_SECONDS = float(os.environ.get("CVAE_CHURN_SECONDS", 8))


@pytest.fixture(scope="module")
def served(tmp_path_factory, trained_run):
    """One server for the module, on a private copy of the tiny run (the churn test writes
    new steps into it), with short client time limits so the slow-client test is quick."""
    work = tmp_path_factory.mktemp("soak")
    directory = trained_run.copy_to(work / "checkpoints")
    with cvae_server(directory, work / "server.log", "--read-timeout", str(READ_TIMEOUT),
                     "--write-timeout", str(WRITE_TIMEOUT), "--no-access-log",
                     workers=WORKERS) as server:
        yield server, directory
    assert "Traceback" not in server.log(), server.log()[-4000:]


def test_soak_mixed_valid_requests_all_succeed_reproducibly_in_bounded_memory(served,
                                                                              record_property):
    server, _ = served
    report = service_checks.soak(server, seconds=SOAK_SECONDS, concurrency=64, warmup=3, seed=0)
    record_property("soak", json.dumps(report))
    print(json.dumps(report))
    assert report["warmup"]["errors"] == 0, report["warmup"]["failure_examples"]
    assert report["errors"] == 0 and not report["problems"], report["failure_examples"]
    assert report["ok"] >= 200 and report["seeded_checked"] >= 50
    assert report["rss_mb"]["growth_after_warmup"] < 75 * WORKERS, report["rss_mb"]


def test_checkpoints_written_and_deleted_under_load_fail_no_request(served, trained_run,
                                                                   record_property):
    server, directory = served
    report = service_checks.churn(server, trained_run.config, trained_run.data, directory,
                                  seconds=CHURN_SECONDS, concurrency=32, keep=2, pause=0.5)
    record_property("churn", json.dumps(report))
    print(json.dumps(report))
    assert report["errors"] == 0 and not report["problems"], report["failure_examples"]
    assert report["last_step_served"] > report["first_step"], report
    # Retention deleted steps, the one served at the start included.
    assert report["first_step"] not in report["steps_left_on_disk"], report
    assert report["seeded_compared_with_final_reference"] > 0


def _connect(port: int, receive_buffer: int | None = None,
             sockets: contextlib.ExitStack | None = None) -> socket.socket:
    sock = socket.socket()
    if sockets is not None:
        sockets.enter_context(sock)
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    return sock


def _closed_by_server(sock: socket.socket, deadline: float) -> float | None:
    """Reads (and drops) whatever arrives until the server closes; returns when it did, or
    None if it was still open at `deadline` (monotonic)."""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return time.monotonic()
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic()
        except TimeoutError:
            return None
    return None


def test_slow_and_abandoned_clients_do_not_block_others_and_are_cut_off(served):
    with contextlib.ExitStack() as sockets:
        _slow_and_abandoned_clients(served[0], sockets)


def _slow_and_abandoned_clients(server, sockets: contextlib.ExitStack):
    port = server.port
    big = "/sample?digit=7&n=1024&scale=4&seed=5"  # a PNG of several MB
    big_length = len(httpx.get(server.url + big, timeout=60).content)
    assert big_length > 1_000_000
    started = time.monotonic()
    idle = [_connect(port, sockets=sockets) for _ in range(20)]  # connect, send nothing
    partial = _connect(port, sockets=sockets)
    partial.sendall(b"GET /sample?digit=7 HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no end of head
    trickler = _connect(port, sockets=sockets)
    trickled = threading.Event()

    def trickle():  # a header one byte at a time, never finished (bounded: <= 15 s)
        trickler.sendall(b"GET /sample?digit=7 HTTP/1.1\r\nX-Slow: ")
        for _ in range(60):
            if trickled.wait(0.25):
                return
            try:
                trickler.sendall(b"a")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    # Five pipelined big requests, never read: more than the kernel's socket buffers hold
    # (4 MB here), so the rest waits in the server's own buffer until the write timeout.
    slow_reader = _connect(port, 4096, sockets)
    slow_reader.sendall(f"GET {big} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() * 5)
    for _ in range(5):  # ask for a large grid and hang up at once
        with _connect(port, sockets=sockets) as abandoned:
            abandoned.sendall(b"GET /sample?n=256&scale=2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")

    # Meanwhile other clients are answered promptly.
    latencies = []
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for i in range(20):
            begun = time.monotonic()
            reply = client.get("/sample", params={"digit": i % 10, "n": 4, "seed": i})
            latencies.append(time.monotonic() - begun)
            assert reply.status_code == 200
    assert max(latencies) < 5, latencies

    # Request time is bounded: the server cuts every stalled connection off by itself.
    deadline = started + max(READ_TIMEOUT, WRITE_TIMEOUT) + 10
    for name, sock in [*(("idle", s) for s in idle), ("partial head", partial),
                       ("trickled head", trickler)]:
        closed = _closed_by_server(sock, deadline)
        assert closed is not None, f"{name} connection still open after {deadline - started} s"
        assert closed - started < READ_TIMEOUT + 5
    trickled.set()
    time.sleep(WRITE_TIMEOUT + 1)  # the slow reader has read nothing for WRITE_TIMEOUT s
    received = 0
    slow_reader.settimeout(5)
    try:
        while chunk := slow_reader.recv(1 << 20):
            received += len(chunk)
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert received < 4 * big_length, "the stalled reader was never cut off"

    # And the server is none the worse.
    assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'status="500"' not in metrics
