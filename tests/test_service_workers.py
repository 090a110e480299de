"""Several worker processes on one port, and several replicas over one checkpoint directory:
real `cvae serve` processes on free loopback ports, real signals. Failures are counted exactly:
every request is accounted for by tests/loadgen.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import httpx
import pytest

from loadgen import Reply, drive
from servers import cvae_serve_command, cvae_server, free_port, ready, stop, wait_for_workers

pytestmark = pytest.mark.slow

SAMPLE = "/sample?digit=7&n=4"


def load_in_background(port: int, seconds: float, concurrency: int, replies: list[Reply],
                       path: str = SAMPLE) -> threading.Thread:
    """Closed-loop load in a thread; every new connection first asks /readyz (its worker).
    Connections open 50 ms apart, so that both workers accept some."""
    thread = threading.Thread(target=lambda: asyncio.run(drive(
        port, path, concurrency, seconds, 1_000_000, replies.append, first_path="/readyz",
        stagger=0.05)))
    thread.start()
    return thread


def worker_of_connection(replies: list[Reply]) -> dict[tuple[int, int], int]:
    """(connection, serial) -> pid of the worker that took that TCP connection."""
    return {(r.connection, r.serial): json.loads(r.body)["pid"]
            for r in replies if r.path == "/readyz" and r.status == 200}


def report(name: str, figures: dict) -> None:
    """Figures for the README and the closing note: `pytest -s` shows them."""
    print(json.dumps({name: figures}))


def wait_until(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return value


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def test_two_workers_share_the_port_and_metrics_add_up_over_both(tmp_path, trained_run):
    with cvae_server(trained_run.directory, tmp_path / "server.log", "--no-access-log",
                     workers=2) as server:
        pids = set(server.worker_pids())
        replies: list[Reply] = []
        load_in_background(server.port, 4.0, 16, replies).join()
        owner = worker_of_connection(replies)
        samples = [r for r in replies if r.path == SAMPLE]
        assert samples and all(r.status == 200 for r in samples)
        served_by = {owner[r.connection, r.serial] for r in samples}
        assert served_by == pids  # both workers answered /sample
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        # Whichever worker answers the scrape, the counts are the whole machine's.
        assert metric(text, "cvae_http_requests_total",
                      '{route="/sample",status="200"}') == len(samples)
        assert metric(text, "cvae_http_requests_total",
                      '{route="/readyz",status="200"}') >= len(owner)
        steps = dict(re.findall(r'^cvae_checkpoint_step\{pid="(\d+)"\} (\S+)$', text, re.M))
        assert {int(pid) for pid in steps} == pids
        assert {float(step) for step in steps.values()} == {float(max(trained_run.steps))}


def test_a_killed_worker_fails_only_requests_on_its_connections_and_is_replaced(
        tmp_path, trained_run):
    with cvae_server(trained_run.directory, tmp_path / "server.log", "--no-access-log",
                     workers=2) as server:
        for _ in range(3):  # until the load's connections land on both workers
            replies: list[Reply] = []
            load = load_in_background(server.port, 15.0, 16, replies)
            time.sleep(2.0)  # every connection is open by now
            if len(set(worker_of_connection(replies).values())) == 2:
                break
            load.join()
        else:
            pytest.fail("3 loads of 16 connections all landed on one worker")
        wait_until(lambda: sum(r.path == SAMPLE for r in replies) > 100)
        owner = worker_of_connection(replies)
        victim = next(iter(owner.values()))
        victim_connections = {c for c, pid in owner.items() if pid == victim}
        os.kill(victim, signal.SIGKILL)
        load.join()
        replacements = wait_for_workers(server, 2) - set(owner.values())
        assert len(replacements) == 1 and victim not in server.worker_pids()
        owner = worker_of_connection(replies)
        # A request that failed, or that the client had to send again, was on a connection
        # the victim had accepted before it died; one such request per connection at most.
        hit = [(r.connection, r.serial - 1) if r.retried else (r.connection, r.serial)
               for r in replies if r.status != 200 or r.retried]
        assert all(owner.get(connection) == victim for connection in hit), hit
        assert len(hit) == len(set(hit)) and set(hit) <= victim_connections
        # The replacement serves again, and so does everyone else.
        new_pid = replacements.pop()
        after = wait_until(lambda: (s := ready(server.url)) and s["pid"] == new_pid and s)
        assert after["step"] == max(trained_run.steps)
        served = [r for r in replies if r.path == SAMPLE and r.status == 200]
        report("kill9", {"sample_ok": len(served), "failed": sum(
            r.status != 200 for r in replies), "retried": sum(r.retried for r in replies),
            "victim_connections": len(victim_connections)})
        assert len(served) > 100
        assert "Traceback" not in server.log()


def test_sigterm_under_load_answers_every_accepted_request_and_exits_0(tmp_path, trained_run):
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(cvae_serve_command(trained_run.directory, port, "--workers",
                                                      "2", "--no-access-log"),
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        from servers import ServerProcess

        wait_for_workers(ServerProcess(process, port, log), 2)
        replies: list[Reply] = []
        load = load_in_background(port, 30.0, 16, replies, "/sample?digit=7&n=64&scale=2")
        wait_until(lambda: sum(r.status == 200 for r in replies) > 50)
        signalled = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        load.join()
    finally:
        stop(process)
    failed = [r for r in replies if r.status != 200 and r.error != "refused"]
    refused = [r for r in replies if r.error == "refused"]
    drained = [r for r in replies if r.status == 200 and r.finished_at > signalled]
    report("sigterm", {"ok": sum(r.status == 200 for r in replies),
                                "answered_after_sigterm": len(drained),
                                "refused_after_sigterm": len(refused)})
    assert not failed, failed[:3]
    assert drained  # requests in flight at SIGTERM were answered, not dropped
    assert all(r.finished_at > signalled for r in refused)
    text = log.read_text()
    assert "Traceback" not in text and "Shutting down: Master" in text
    assert "Error while closing socket" not in text  # each worker logged it before the fix


def test_two_replicas_over_one_directory_move_to_a_new_step_and_agree_byte_for_byte(
        tmp_path, trained_run):
    directory = trained_run.copy_to(tmp_path / "checkpoints", steps=(min(trained_run.steps),))
    query = "/sample?digit=3&n=9&seed=21&temperature=0.7"
    poll = 0.5
    with cvae_server(directory, tmp_path / "a.log", "--poll-interval", str(poll)) as a, \
            cvae_server(directory, tmp_path / "b.log", "--poll-interval", str(poll)) as b:
        before = [httpx.get(server.url + query, timeout=30) for server in (a, b)]
        assert before[0].content == before[1].content
        assert before[0].headers["etag"] == before[1].headers["etag"]
        # A trainer commits a newer step the way Orbax does: written aside, then renamed.
        newest = max(trained_run.steps)
        shutil.copytree(trained_run.directory / str(newest), tmp_path / "staging")
        written = time.monotonic()
        (tmp_path / "staging").rename(directory / str(newest))
        switched = {}
        for name, server in (("a", a), ("b", b)):
            wait_until(lambda: (ready(server.url) or {}).get("step") == newest)
            switched[name] = round(time.monotonic() - written, 2)
        report("replica_switch_seconds", switched)
        after = [httpx.get(server.url + query, timeout=30) for server in (a, b)]
        assert [r.headers["x-checkpoint-step"] for r in after] == [str(newest)] * 2
        assert after[0].content == after[1].content != before[0].content
        assert after[0].headers["etag"] == after[1].headers["etag"] != before[0].headers["etag"]
        assert ready(a.url)["fingerprint"] == ready(b.url)["fingerprint"]
