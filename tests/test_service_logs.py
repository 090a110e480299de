"""What `cvae serve` logs (service/logs.py, service/server.py): INFO for normal events, no error
line on a clean shutdown, and `--log-format json` lines whose request id is the X-Request-ID
header, on real servers on loopback; the request-id middleware and the formatter in-process."""

from __future__ import annotations

import json
import logging
import re
import sys

import httpx
from fastapi.testclient import TestClient

from servers import cvae_server, stop
from service.app import create_app
from service.logs import JsonFormatter, request_id

GENERATED_ID = re.compile(r"[0-9a-f]{32}")
# What a clean start, a few requests and SIGTERM must never print (the socket error was gunicorn
# closing a listening socket that the event loop had already closed).
ERROR_WORDS = ("error", "traceback", "warning", "bad file descriptor")


def serve_then_stop(trained_run, log_path, *extra: str, requests=()) -> tuple[list, str]:
    """Starts `cvae serve`, sends `requests` ((path, headers) pairs), stops it with SIGTERM;
    returns the responses and the whole log."""
    with cvae_server(trained_run.directory, log_path, *extra) as server:
        responses = [httpx.get(server.url + path, headers=headers, timeout=30)
                     for path, headers in requests]
        assert stop(server.process) == 0
    return responses, log_path.read_text()


def test_text_log_says_the_served_step_at_info_and_nothing_alarming_on_sigterm(
        tmp_path, trained_run):
    responses, log = serve_then_stop(trained_run, tmp_path / "server.log",
                                     requests=[("/sample?digit=3&seed=1", {})])
    step = max(trained_run.steps)
    assert f"INFO service.checkpoints: serving checkpoint step {step} from" in log
    assert "Shutting down: Master" in log
    assert not [line for line in log.splitlines()
                if any(word in line.lower() for word in ERROR_WORDS)]
    assert responses[0].status_code == 200
    assert "x-request-id" not in responses[0].headers  # text mode: responses as they were


def test_json_log_is_one_object_per_line_and_access_lines_carry_the_x_request_id(
        tmp_path, trained_run):
    requests = [("/sample?digit=3&seed=1", {"X-Request-ID": "trace-42.a:b"}),
                ("/sample?digit=10", {}),
                ("/healthz", {"X-Request-ID": "not sane: has spaces"}),
                ("/healthz", {"X-Request-ID": "x" * 129})]
    responses, log = serve_then_stop(trained_run, tmp_path / "server.log",
                                     "--log-format", "json", requests=requests)
    lines = [json.loads(line) for line in log.splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message", "pid"} <= line.keys() for line in lines)
    assert not [line for line in lines if line["level"] != "INFO"]
    assert not [line for line in lines
                if any(word in line["message"].lower() for word in ERROR_WORDS)]
    # The block check may first say which block sizes it dropped on this CPU.
    served = [line for line in lines if line["logger"] == "service.checkpoints"
              and line["message"].startswith("serving checkpoint")]
    assert served[0]["message"].startswith(f"serving checkpoint step {max(trained_run.steps)}")

    ids = [response.headers["x-request-id"] for response in responses]
    assert ids[0] == "trace-42.a:b"
    assert all(GENERATED_ID.fullmatch(given) for given in ids[1:]) and len(set(ids)) == 4
    access = {line["request_id"]: line for line in lines if line["logger"] == "uvicorn.access"}
    for (path, _), response, given in zip(requests, responses, ids):
        line = access[given]
        assert (line["method"], line["path"], line["status"]) == ("GET", path,
                                                                  response.status_code)
        assert line["client"].startswith("127.0.0.1:") and line["http_version"] == "1.1"
    assert responses[0].status_code == 200 and responses[1].status_code == 422


def test_request_ids_are_off_unless_asked_for_and_echo_only_sane_ones():
    with TestClient(create_app("unused")) as plain:
        assert "x-request-id" not in plain.get("/healthz").headers
    with TestClient(create_app("unused", request_ids=True)) as client:
        for sane in ("a", "0f" * 64, "req_1.2:3+4/5=6-7"):
            assert client.get("/healthz", headers={"X-Request-ID": sane}).headers[
                "x-request-id"] == sane
        for insane in ("", "a" * 129, "two words", "caf\u00e9".encode(), "a\tb"):
            given = client.get("/healthz", headers={"X-Request-ID": insane})
            assert GENERATED_ID.fullmatch(given.headers["x-request-id"])
        first, second = (client.get("/healthz").headers["x-request-id"] for _ in range(2))
        assert first != second
        # The 422 and the 503 (no model) carry it too.
        assert "x-request-id" in client.get("/sample?digit=10").headers
        assert client.get("/sample").status_code == 503
        assert "x-request-id" in client.get("/sample").headers


def test_json_formatter_writes_one_line_with_request_and_exception_fields():
    formatter = JsonFormatter()
    try:
        raise ValueError("two\nlines")
    except ValueError:
        record = logging.LogRecord("service.x", logging.ERROR, __file__, 1, "failed %d", (7,),
                                   sys.exc_info())
    access = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/x?y=1", "1.1", 200), None)
    token = request_id.set("abc")  # as while a request is answered
    try:
        line = formatter.format(record)
    finally:
        request_id.reset(token)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "failed 7" and parsed["level"] == "ERROR"
    assert parsed["request_id"] == "abc"
    assert parsed["logger"] == "service.x" and parsed["time"].endswith("Z")
    assert "ValueError: two\nlines" in parsed["exception"]
    assert json.loads(formatter.format(access)) | {"time": 0} == {
        "time": 0, "level": "INFO", "logger": "uvicorn.access", "pid": access.process,
        "message": '127.0.0.1:5 - "GET /x?y=1 HTTP/1.1" 200', "client": "127.0.0.1:5",
        "method": "GET", "path": "/x?y=1", "http_version": "1.1", "status": 200}
