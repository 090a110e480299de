"""Property-based fuzzing of the HTTP API from its OpenAPI schema (schemathesis), against a
real `cvae serve` process on loopback: no 5xx, every response as the schema documents it.
The short, derandomized version of `python -m bench.soak`'s fuzz phase."""

from __future__ import annotations

import json

import pytest

from bench import soak
from servers import cvae_server

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 40  # per operation and mode (valid, invalid)


@pytest.fixture(scope="module")
def server(tmp_path_factory, trained_run):
    work = tmp_path_factory.mktemp("fuzz")
    with cvae_server(trained_run.directory, work / "server.log") as server:
        yield server
    assert "Traceback" not in server.log(), server.log()[-4000:]


def test_schemathesis_finds_no_5xx_and_no_schema_violation(server, record_property):
    report = soak.fuzz(server.url, max_examples=MAX_EXAMPLES, seed=0)
    record_property("fuzz", json.dumps(report))
    print(json.dumps(report))
    assert report["failures"] == 0, "\n\n".join(report["failure_examples"])
    assert not any(status.startswith("HTTP 5") for status in report["statuses"]), report
    assert report["cases"] >= MAX_EXAMPLES  # /sample alone gives up to 2 * MAX_EXAMPLES
    assert report["statuses"].get("HTTP 422", 0) > 0 and report["statuses"].get("HTTP 200", 0)
