"""A closed-loop HTTP/1.1 load generator on raw asyncio streams, for the service tests.

    replies = []
    asyncio.run(drive(port, "/sample?digit=7", concurrency=64, seconds=5,
                      max_requests=10_000, on_reply=replies.append))

C keep-alive connections, each sending its next GET as soon as the previous answer arrived,
until the time or the shared request budget runs out. It costs little CPU, and every outcome
is a `Reply`, so tests can count failures exactly. As HTTP clients do (RFC 9112, 9.3.1), a GET
sent on a reused connection that the server closed before answering any byte of it is retried
once on a new connection (`Reply.retried`): that is the ordinary end of a keep-alive
connection, not a failure. A new connection that the server refuses, or resets before
answering anything, is reported with status 0 and error "refused", and that client stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Callable


@dataclasses.dataclass
class Reply:
    """One request's outcome. status 0: no HTTP answer (`error` says why)."""

    path: str
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    seconds: float
    connection: int = 0  # which of the generator's connections sent it
    serial: int = 0  # which (re)connection of that connection: 0 first, 1 after a reconnect...
    error: str | None = None
    retried: bool = False
    finished_at: float = 0.0  # perf_counter when the outcome was known


class NoAnswer(Exception):
    """The connection ended before any byte of the response."""


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            raise NoAnswer("closed before answering") from None
        raise
    length = int(parse_headers(head)["content-length"])
    return head, await reader.readexactly(length)


def parse_headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return {name.strip().lower(): value.strip() for name, value in pairs}


FAILURES = (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError,
            KeyError, NoAnswer)


async def connection_loop(port: int, next_path: str | Callable[[], str], stop_at: float,
                          budget: list[int], on_reply: Callable[[Reply], None],
                          connection: int = 0, timeout: float = 60.0,
                          first_path: str | None = None) -> None:
    """One keep-alive connection sending GETs back to back until `stop_at` (perf_counter) or
    until the shared `budget` (a one-element list) is spent. `next_path` is the path, or a
    function giving each request's path; `first_path`, when given, is sent first on every new
    connection (e.g. "/readyz", to learn which worker took the connection)."""
    reader = writer = None
    serial, answered = -1, 0  # answered: responses on the current connection
    while time.perf_counter() < stop_at and budget[0] > 0:
        budget[0] -= 1
        if writer is None and first_path is not None:
            path = first_path
        else:
            path = next_path() if callable(next_path) else next_path
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        started = time.perf_counter()
        retried = False
        while True:
            fresh = writer is None
            try:
                if fresh:
                    serial, answered = serial + 1, 0
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                head, body = await asyncio.wait_for(read_response(reader), timeout)
                break
            except FAILURES as error:
                if writer is not None:
                    writer.close()
                reader = writer = None
                stale = isinstance(error, (NoAnswer, ConnectionResetError, BrokenPipeError))
                if stale and not fresh and answered and not retried:
                    retried = True  # the server ended a keep-alive connection: ask again
                    continue
                refused = fresh and isinstance(error, (ConnectionRefusedError, NoAnswer,
                                                       ConnectionResetError))
                on_reply(Reply(path, 0, {}, b"", time.perf_counter() - started, connection,
                               serial, "refused" if refused else repr(error), retried,
                               time.perf_counter()))
                head = None
                break
        if head is None:
            if refused:
                return  # the server is gone: this client stops
            continue
        answered += 1
        headers = parse_headers(head)
        if headers.get("connection", "").lower() == "close":
            writer.close()
            reader = writer = None
        on_reply(Reply(path, int(head[9:12]), headers, body, time.perf_counter() - started,
                       connection, serial, None, retried, time.perf_counter()))
    if writer is not None:
        writer.close()


async def drive(port: int, next_path: str | Callable[[], str], concurrency: int, seconds: float,
                max_requests: int, on_reply: Callable[[Reply], None],
                first_path: str | None = None, stagger: float = 0.0) -> float:
    """`concurrency` connections for at most `seconds` and `max_requests` in all; returns the
    elapsed seconds. Connection i opens `i * stagger` s after the first (so that workers
    sharing a listening socket each get some of them)."""
    started = time.perf_counter()
    stop_at = started + seconds
    budget = [max_requests]

    async def one(i: int) -> None:
        await asyncio.sleep(i * stagger)
        await connection_loop(port, next_path, stop_at, budget, on_reply, i,
                              first_path=first_path)

    await asyncio.gather(*(one(i) for i in range(concurrency)))
    return time.perf_counter() - started


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
