"""`GET /sample` answered past Starlette's router (service/direct.py): the same answers, status,
headers and bytes, as through the whole stack, with the app's middleware and handlers."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.app import create_app
from service.direct import ServiceApp
from service.routes import sampling

QUERIES = (
    {"digit": 7, "seed": 1, "n": 4},                  # 200, seeded: ETag, Cache-Control
    {"digit": 70},                                   # 422 from the parameters' model
    {"digit": 3, "colour": "red"},                   # 422: an unknown parameter, named
    {"digit": 3, "n": 4, "scale": 64, "cols": 1},    # 422 from the route: too large a grid
)


class Counted:
    """The app's whole middleware stack, counting the requests that reach it."""

    def __init__(self, stack):
        self.stack, self.calls = stack, 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        await self.stack(scope, receive, send)


def through_the_stack(app: FastAPI):
    """The app as FastAPI answers it, every route through the router."""
    async def whole(scope, receive, send):
        await FastAPI.__call__(app, scope, receive, send)
    return whole


def answer(client: TestClient, params: dict, headers: dict | None = None):
    response = client.get("/sample", params=params, headers=headers)
    kept = {name: value for name, value in response.headers.items()
            if name not in ("date", "x-request-id")}
    return response.status_code, kept, response.content


@pytest.fixture(scope="module")
def app(trained_run):
    app = create_app(trained_run.directory, request_ids=True)
    with TestClient(app):
        app.middleware_stack = Counted(app.middleware_stack)
        yield app


def test_sample_answers_directly_as_the_whole_stack_does(app):
    direct, whole = TestClient(app), TestClient(through_the_stack(app))
    for params in QUERIES:
        before = app.middleware_stack.calls
        assert answer(direct, params) == answer(whole, params), params
        assert app.middleware_stack.calls == before + 1  # the direct answer skipped it
    status, headers, _ = answer(direct, QUERIES[0])
    assert status == 200 and headers["etag"]
    revalidated = {"if-none-match": headers["etag"]}
    assert answer(direct, QUERIES[0], revalidated) == answer(whole, QUERIES[0], revalidated)
    assert answer(direct, QUERIES[0], revalidated)[0] == 304


def test_other_methods_and_paths_go_through_the_router(app):
    client = TestClient(app)
    before = app.middleware_stack.calls
    assert client.head("/sample").status_code == 405
    assert client.get("/healthz").status_code == 200
    assert app.middleware_stack.calls == before + 2


def test_the_apps_middleware_runs_on_the_direct_answer(app):
    client = TestClient(app)
    before = app.middleware_stack.calls
    response = client.get("/sample", params={"digit": 7, "seed": 2, "n": 1},
                          headers={"x-request-id": "abc-123"})
    assert response.status_code == 200 and app.middleware_stack.calls == before
    assert response.headers["x-request-id"] == "abc-123"  # service.logs.RequestIdMiddleware

    def served(status: str) -> float:
        line = next((line for line in client.get("/metrics").text.splitlines()
                     if line.startswith("cvae_http_requests_total{")
                     and 'route="/sample"' in line and f'status="{status}"' in line), None)
        return 0.0 if line is None else float(line.rsplit(" ", 1)[1])

    ok, refused = served("200"), served("422")
    client.get("/sample", params={"digit": 7, "seed": 3, "n": 1})
    client.get("/sample", params={"digit": 70})
    assert (served("200"), served("422")) == (ok + 1, refused + 1)


def test_no_model_is_the_same_503_either_way(tmp_path):
    app = create_app(tmp_path / "nothing-yet")
    with TestClient(app) as direct:
        app.middleware_stack = Counted(app.middleware_stack)
        status, headers, body = answer(direct, {"digit": 7})
        assert status == 503 and headers["retry-after"] and app.middleware_stack.calls == 0
        assert (status, headers, body) == answer(TestClient(through_the_stack(app)),
                                                 {"digit": 7})


def test_an_unhandled_error_is_the_same_500_either_way(app, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the route")

    monkeypatch.setattr(sampling, "grid_columns", broken)
    direct = TestClient(app, raise_server_exceptions=False)
    whole = TestClient(through_the_stack(app), raise_server_exceptions=False)
    before = app.middleware_stack.calls
    status, headers, body = answer(direct, {"digit": 7})
    assert (status, body) == (500, b"Internal Server Error")
    assert app.middleware_stack.calls == before
    assert (status, headers, body) == answer(whole, {"digit": 7})


def test_a_route_the_router_does_not_reach_at_its_path_goes_through_it():
    app = ServiceApp()
    app.include_router(sampling.router, prefix="/v1")
    app.answer_directly(sampling.SAMPLE_ROUTE)
    client = TestClient(app)
    assert client.get("/sample").status_code == 404  # as the router answers it
