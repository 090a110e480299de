"""`cvae serve --log-format text|json`: what the service's log lines look like, and request ids.

Synopsis:

    configure_logging("json")                    # in `cvae serve`, before gunicorn starts
    app.add_middleware(RequestIdMiddleware)      # create_app(..., request_ids=True)

`text` (the default) keeps gunicorn's and uvicorn's usual lines. `json` writes one JSON object
per line, for log collectors: `time` (UTC, ISO 8601), `level`, `logger`, `message`, `pid`, and
`exception` when there is a traceback. Lines written while a request is answered, the access
line included, also carry its `request_id`, which `RequestIdMiddleware` returns as the
X-Request-ID response header: the client's own X-Request-ID when it is sane (1 to 128 of
`A-Z a-z 0-9 . _ : + / = -`, so it cannot forge log lines), else a fresh random one. Access
lines add `client`, `method`, `path`, `http_version` and `status`.

Standard library only: the gunicorn master loads this, and must never load JAX.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import re
import secrets

LOG_FORMATS = ("text", "json")
REQUEST_ID_HEADER = b"x-request-id"
SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:+/=-]{1,128}")
# The request being answered. Each request runs in its own asyncio task, whose copy of the
# context this is set in, so it never leaks into another request's lines.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id",
                                                                        default=None)
ACCESS_LOGGER = "uvicorn.access"
# uvicorn's access line: '%s - "%s %s HTTP/%s" %d' % (client, method, path, version, status).
ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        time = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        line = {"time": time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "level": record.levelname, "logger": record.name,
                "message": record.getMessage(), "pid": record.process}
        if (current := request_id.get()) is not None:
            line["request_id"] = current
        if (record.name == ACCESS_LOGGER and isinstance(record.args, tuple)
                and len(record.args) == len(ACCESS_FIELDS)):
            line.update(zip(ACCESS_FIELDS, record.args))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(log_format: str) -> None:
    """The format of the root logger's lines (`cvae.cli` set it up; gunicorn's own loggers get
    theirs from its logger class, service/server.py)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, not {log_format!r}")
    if log_format == "json":
        root = logging.getLogger()
        if not root.handlers:
            root.addHandler(logging.StreamHandler())
        for handler in root.handlers:
            handler.setFormatter(JsonFormatter())
        logging.captureWarnings(True)  # Python warnings become JSON lines too


def new_request_id() -> str:
    return secrets.token_hex(16)


class RequestIdMiddleware:
    """Gives each HTTP request an id (see the module docstring): set for the log lines written
    while it is answered, and returned as X-Request-ID."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((value for name, value in scope["headers"] if name == REQUEST_ID_HEADER),
                     None)
        current = (given.decode("ascii") if given is not None and SANE_REQUEST_ID.fullmatch(given)
                   else new_request_id())
        request_id.set(current)
        header = (REQUEST_ID_HEADER, current.encode("ascii"))

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await self.app(scope, receive, send_with_id)
