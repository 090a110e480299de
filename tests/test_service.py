"""The HTTP contract of service/app.py (docs/design.md, "HTTP service"), through TestClient."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import io
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from cvae.sampling.grid import grid_shape
from service.app import create_app
from service.responses import MAX_PIXELS


@pytest.fixture(scope="module")
def client(trained_run):
    with TestClient(create_app(trained_run.directory)) as client:
        yield client


def png_size(content: bytes) -> tuple[tuple[int, int], str]:
    with Image.open(io.BytesIO(content)) as image:
        return image.size, image.mode


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("query, name, allowed", [
    ("digit=10", "digit", "0..9"),
    ("digit=-1", "digit", "0..9"),
    ("digit=seven", "digit", "0..9"),
    ("digit=3.5", "digit", "0..9"),
    ("n=0", "n", "1..1024"),
    ("n=100000", "n", "1..1024"),
    ("n=many", "n", "1..1024"),
    ("n=4.0", "n", "1..1024"),  # the schema's integer as written, not pydantic's lax reading
    ("cols=0", "cols", "1..1024"),
    ("cols=1025", "cols", "1..1024"),
    ("seed=-1", "seed", f"0..{2**32 - 1}"),
    ("seed=4294967296", "seed", f"0..{2**32 - 1}"),
    ("seed=x", "seed", f"0..{2**32 - 1}"),
    ("temperature=-1", "temperature", "0 < temperature <= 2"),
    ("temperature=0", "temperature", "0 < temperature <= 2"),
    ("temperature=2.5", "temperature", "0 < temperature <= 2"),
    ("temperature=nan", "temperature", "0 < temperature <= 2"),
    ("temperature=hot", "temperature", "0 < temperature <= 2"),
    ("scale=0", "scale", "1..8"),
    ("scale=50", "scale", "1..8"),
    ("pad=-1", "pad", "0..8"),
    ("pad=9", "pad", "0..8"),
])
def test_bad_parameter_is_422_naming_it_and_its_range(client, query, name, allowed):
    response = client.get(f"/sample?digit=7&{query}")
    assert response.status_code == 422
    body = response.json()
    value = query.split("=", 1)[1]
    assert body["message"].startswith(f"{name}: must be ")
    assert allowed in body["message"] and repr(value) in body["message"]
    assert body["detail"][0]["loc"] == ["query", name]


def test_several_bad_parameters_are_all_named(client):
    message = client.get("/sample?digit=seven&n=0&scale=50").json()["message"]
    assert [part.split(":")[0] for part in message.split("; ")] == ["digit", "n", "scale"]


@pytest.mark.parametrize("method, path, query, unknown, takes", [
    ("GET", "/sample", "digits=7&n=4", ["digits"], "digit, label, n, cols, seed, temperature"),
    ("GET", "/sample", "digit=7&Seed=3&colums=2", ["Seed", "colums"], "digit, label, n, cols"),
    ("GET", "/interpolate", "walk=digits&step=4", ["step"], "walk, digit, label, seed, to_seed"),
    ("POST", "/transfer", "digit=3&samples=1", ["digit"], "label, digits, samples, seed"),
    ("POST", "/classify", "label=3", ["label"], "prepare"),
])
def test_unknown_parameter_is_422_naming_it(client, method, path, query, unknown, takes):
    """A typo is refused before any work, in the shape of every other 422, instead of being
    ignored (`/sample?digits=7` used to answer all ten digits)."""
    response = client.request(method, f"{path}?{query}", content=b"not read",
                              headers={"Content-Type": "image/png"})
    assert response.status_code == 422, response.text
    body = response.json()
    assert [item["loc"] for item in body["detail"]] == [["query", name] for name in unknown]
    assert body["message"].startswith(f"{unknown[0]}: unknown parameter (got ")
    assert all(f"{name}: unknown parameter" in body["message"] for name in unknown)
    assert f"({path} takes {takes}" in body["message"]


def test_an_unknown_parameter_is_named_beside_a_bad_known_one(client):
    """A label over every model's limit (`cvae.limits.MAX_CLASSES`) is refused with the served
    model's range, as one over its own classes is (`check_labels`)."""
    message = client.get("/sample?digit=1000&digits=7").json()["message"]
    assert message.startswith("digit: must be an integer in 0..9 (this model's classes), or "
                              "omitted for one row per class (got '1000'); digits: unknown "
                              "parameter (got '7') (/sample takes digit, label, n,")


def test_grid_too_large_for_memory_is_422(client):
    response = client.get("/sample?n=1024&scale=8")  # ten rows of 1024 tiles of 224 px
    assert response.status_code == 422
    assert "MP" in response.json()["message"] and "lower n, scale or pad" in response.json()[
        "message"]


# ---- the picture ---------------------------------------------------------------------------


@pytest.mark.parametrize("query, images, cols, scale, pad", [
    ("digit=7", 16, 4, 1, 2),
    ("digit=0&n=17", 17, 5, 1, 2),
    ("digit=7&n=5&cols=2&scale=2&pad=0", 5, 2, 2, 0),
    ("digit=3&n=1&scale=8&pad=8", 1, 1, 8, 8),
    ("n=3", 30, 3, 1, 2),  # digit omitted: one row per digit, cols = n
    ("n=4&cols=8&pad=1", 40, 8, 1, 1),
])
def test_png_geometry_follows_make_grid_layout(client, query, images, cols, scale, pad):
    response = client.get(f"/sample?seed=1&{query}")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    height, width = grid_shape(images, cols, scale=scale, pad=pad)
    rows = -(-images // cols)
    assert (width, height) == (cols * (28 * scale + pad) + pad, rows * (28 * scale + pad) + pad)
    assert png_size(response.content) == ((width, height), "L")


def test_same_seed_same_bytes_other_seed_differs(client, trained_run):
    first = client.get("/sample?digit=7&n=9&seed=42&temperature=0.8")
    second = client.get("/sample?digit=7&n=9&seed=42&temperature=0.8")
    assert first.content == second.content
    assert first.headers["x-seed"] == "42"
    assert first.headers["x-checkpoint-step"] == str(max(trained_run.steps))
    assert client.get("/sample?digit=7&n=9&seed=43&temperature=0.8").content != first.content
    assert client.get("/sample?digit=6&n=9&seed=42&temperature=0.8").content != first.content


def test_the_query_string_is_read_as_starlette_reads_it(client):
    """/sample validates a plain copy of the query parameters (service/params.py,
    `query_model`): escapes are decoded, the last of a repeated name counts, and a blank value
    is given (so refused)."""
    plain = client.get("/sample?digit=7&n=4&seed=5").content
    assert client.get("/sample?digit=3&digit=%37&n=4&seed=5").content == plain
    assert client.get("/sample?digit=7&n=4&seed=5&seed=5").content == plain
    blank = client.get("/sample?digit=&n=4&seed=5")
    assert blank.status_code == 422
    assert [(item["loc"], item["input"]) for item in blank.json()["detail"]] == [
        (["query", "digit"], "")]


def test_random_seed_is_reported_and_reproduces_the_picture(client):
    drawn = client.get("/sample?digit=2&n=4")
    seed = drawn.headers["x-seed"]
    assert seed.isdigit()
    assert client.get(f"/sample?digit=2&n=4&seed={seed}").content == drawn.content
    assert client.get("/sample?digit=2&n=4").headers["x-seed"] != seed


class GatedDecoder:
    """Wraps a sampler; `decode` waits for `release`, so requests queue up behind it
    deterministically."""

    def __init__(self, sampler):
        self.sampler, self.noise_dim = sampler, sampler.noise_dim
        self.classes, self.config = sampler.classes, sampler.config  # what the routes read
        self.entered, self.release = threading.Event(), threading.Event()

    def decode(self, z, labels):
        self.entered.set()
        assert self.release.wait(30)
        return self.sampler.decode(z, labels)


def serve_with(client: TestClient, decoder) -> None:
    """Make the app's served model decode through `decoder` (same weights, same step)."""
    watcher = client.app.state.watcher
    watcher.current = dataclasses.replace(watcher.current, sampler=decoder)


def test_concurrent_requests_give_the_bytes_of_requests_made_alone(client, trained_run):
    queries = [f"/sample?digit={i % 10}&n={1 + i % 7}&seed={i}&temperature={0.5 + i % 3 / 2}"
               for i in range(24)] + ["/sample?n=2&seed=5"]
    alone = [client.get(query).content for query in queries]
    with TestClient(create_app(trained_run.directory, poll_interval=3600)) as batching:
        gated = GatedDecoder(batching.app.state.watcher.current.sampler)
        serve_with(batching, gated)
        with concurrent.futures.ThreadPoolExecutor(len(queries)) as pool:
            first = pool.submit(batching.get, queries[0])
            assert gated.entered.wait(30)
            rest = [pool.submit(batching.get, query) for query in queries[1:]]
            wait_until(lambda: batching.app.state.batcher.depth == len(queries) - 1)
            gated.release.set()
            together = [first.result().content] + [f.result().content for f in rest]
        metrics = batching.get("/metrics").text
    assert together == alone
    values = dict(line.split() for line in metrics.splitlines()
                  if line.startswith(("cvae_batch_requests_count", "cvae_batch_requests_sum")))
    # Two decode calls for 25 requests: the lone first one, then everything that queued.
    assert float(values["cvae_batch_requests_count"]) == 2
    assert float(values["cvae_batch_requests_sum"]) == len(queries)


# ---- HTTP caching --------------------------------------------------------------------------


def test_seeded_picture_has_a_strong_etag_and_revalidates_to_304(client, trained_run):
    first = client.get("/sample?digit=4&n=6&seed=11")
    etag = first.headers["etag"]
    assert etag.startswith(f'"{max(trained_run.steps)}-') and etag.endswith('"')
    assert first.headers["cache-control"] == "public, max-age=600"
    again = client.get("/sample?digit=4&n=6&seed=11")
    assert again.headers["etag"] == etag and again.content == first.content
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        cached = client.get("/sample?digit=4&n=6&seed=11", headers={"If-None-Match": header})
        assert cached.status_code == 304 and cached.content == b"", header
        assert cached.headers["etag"] == etag and cached.headers["x-seed"] == "11"
    stale = client.get("/sample?digit=4&n=6&seed=11", headers={"If-None-Match": '"468-x"'})
    assert stale.status_code == 200 and stale.content == first.content
    # Any parameter that changes the bytes changes the tag.
    for other in ("digit=5&n=6&seed=11", "digit=4&n=7&seed=11", "digit=4&n=6&seed=12",
                  "digit=4&n=6&seed=11&temperature=0.5", "digit=4&n=6&seed=11&scale=2",
                  "digit=4&n=6&seed=11&pad=0", "digit=4&n=6&seed=11&cols=2"):
        assert client.get(f"/sample?{other}").headers["etag"] != etag, other
    # Spelling the same request differently does not.
    assert client.get("/sample?seed=11&n=6&digit=4&temperature=1&cols=3").headers[
        "etag"] == etag


def test_unseeded_picture_is_not_cacheable(client):
    drawn = client.get("/sample?digit=4&n=6")
    assert drawn.headers["cache-control"] == "no-store" and "etag" not in drawn.headers
    assert client.get("/sample?digit=4&n=6", headers={"If-None-Match": "*"}).status_code == 200


# ---- operations ----------------------------------------------------------------------------


def test_health_ready_metrics_docs_and_page(client, trained_run):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["step"] == max(trained_run.steps)
    assert ready["pid"] == os.getpid() and len(ready["fingerprint"]) == 64
    assert ready["config"]["model_options"]["latent_dim"] == \
        trained_run.config.model.options.latent_dim
    assert ready["note"] is None
    client.get("/sample?digit=1&n=2")
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for expected in ('cvae_http_requests_total{route="/sample",status="200"}',
                     "cvae_http_request_duration_seconds_bucket", "cvae_batch_rows_bucket",
                     f"cvae_checkpoint_step {float(max(trained_run.steps))}"):
        assert expected in metrics.text
    sample = client.get("/openapi.json").json()["paths"]["/sample"]["get"]
    assert f"{MAX_PIXELS // 10**6} MP" in sample["responses"]["422"]["description"]
    assert {"200", "304", "422", "503"} <= set(sample["responses"])
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<img" in page.text and "http://" not in page.text and "https://" not in page.text


# What each kind of file the API pages load must be served as.
ASSET_TYPES = {".js": ("text/javascript", "application/javascript"), ".css": ("text/css",),
               ".png": ("image/png",)}


@pytest.mark.parametrize("page, marker", [("/docs", "SwaggerUIBundle"),
                                          ("/redoc", "<redoc spec-url=")])
def test_api_pages_load_only_this_services_own_files(client, page, marker):
    """/docs and /redoc work offline: every script, style and icon they reference is a path on
    this service, and is served with its content type."""
    html = client.get(page)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert marker in html.text and "/openapi.json" in html.text
    assert "default-src 'self'" in html.headers["content-security-policy"]
    assert "http://" not in html.text and "https://" not in html.text
    references = re.findall(r'(?:src|href)="([^"]*)"', html.text)
    assert len(references) >= 2
    for url in references:
        assert url.startswith("/docs/assets/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        content_type = asset.headers["content-type"].split(";")[0]
        assert content_type in ASSET_TYPES[Path(url).suffix], (url, content_type)
        assert len(asset.content) > 1000, url
    assert client.get("/docs/assets/..%2Fcore.py").status_code == 404
    assert client.get("/docs/assets/swagger-ui.js").status_code == 404


OPENAPI_SNAPSHOT = Path(__file__).with_name("openapi.json")


def test_openapi_schema_is_the_committed_snapshot():
    """The HTTP contract changes only on purpose. After a deliberate change, rewrite the
    snapshot with `CVAE_UPDATE_OPENAPI=1 pytest tests/test_service.py -k snapshot` and review
    its diff."""
    text = json.dumps(create_app("unused").openapi(), sort_keys=True, indent=1) + "\n"
    if os.environ.get("CVAE_UPDATE_OPENAPI") == "1":
        OPENAPI_SNAPSHOT.write_text(text)
    assert text == OPENAPI_SNAPSHOT.read_text()


def test_no_checkpoint_is_503_then_served_once_one_appears(tmp_path, trained_run):
    directory = tmp_path / "checkpoints"  # does not exist yet
    with TestClient(create_app(directory, poll_interval=0.1)) as client:
        assert client.get("/healthz").status_code == 200
        for path in ("/readyz", "/sample?digit=7"):
            response = client.get(path)
            assert response.status_code == 503
            assert str(directory) in response.json()["detail"]
            assert "run `make train`" in response.json()["detail"]
        assert client.get("/sample").headers["retry-after"]
        # Appear the way Orbax commits: complete under a temporary name, then renamed.
        trained_run.copy_to(tmp_path / "staging", steps=(4,))
        directory.mkdir()
        (tmp_path / "staging" / "4").rename(directory / "4")
        wait_until(lambda: client.get("/readyz").status_code == 200)
        response = client.get("/sample?digit=7")
        assert response.status_code == 200 and response.headers["x-checkpoint-step"] == "4"


def corrupt(step_dir):
    for item in (step_dir / "state").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")


def test_corrupt_newest_checkpoint_falls_back_to_the_last_good(tmp_path, trained_run):
    directory = trained_run.copy_to(tmp_path / "checkpoints")
    corrupt(directory / "8")
    with TestClient(create_app(directory)) as client:
        ready = client.get("/readyz").json()
        assert ready["step"] == 4
        assert "step 8" in ready["note"] and "could not be read" in ready["note"]
        assert client.get("/sample?digit=3").headers["x-checkpoint-step"] == "4"


def test_newer_checkpoints_are_swapped_in_and_corrupt_ones_skipped(tmp_path, trained_run):
    directory = trained_run.copy_to(tmp_path / "checkpoints", steps=(4,))
    with TestClient(create_app(directory, poll_interval=0.1)) as client:
        before = client.get("/sample?digit=5&seed=7")
        assert before.headers["x-checkpoint-step"] == "4"
        shutil.copytree(trained_run.directory / "8", tmp_path / "bad")
        corrupt(tmp_path / "bad")
        (tmp_path / "bad").rename(directory / "12")
        wait_until(lambda: (client.get("/readyz").json()["note"] or "").count("step 12"))
        assert client.get("/sample?digit=5&seed=7").content == before.content  # still step 4
        shutil.copytree(trained_run.directory / "8", tmp_path / "good")
        (tmp_path / "good").rename(directory / "16")
        wait_until(lambda: client.get("/readyz").json()["step"] == 16)
        after = client.get("/sample?digit=5&seed=7")
        assert after.headers["x-checkpoint-step"] == "16" and after.content != before.content
        shutil.rmtree(directory / "16")  # a step vanishing under the service: keep serving
        time.sleep(0.3)
        assert client.get("/sample?digit=5&seed=7").status_code == 200


def test_the_collector_skips_the_loaded_heap_while_serving(trained_run):
    """A full collection walks every tracked object; while serving, JAX, the frameworks and the
    model are frozen out of it (service/app.py lifespan), and given back at shutdown."""
    with TestClient(create_app(trained_run.directory, poll_interval=3600)) as client:
        assert client.get("/sample?digit=1&n=1&seed=1").status_code == 200
        frozen = gc.get_freeze_count()
        gc.collect()
        assert frozen > 50_000 and len(gc.get_objects()) < frozen // 10
    assert gc.get_freeze_count() == 0


def test_full_queue_is_503_with_retry_after(trained_run):
    with TestClient(create_app(trained_run.directory, max_pending_rows=2,
                               poll_interval=3600)) as client:
        gated = GatedDecoder(client.app.state.watcher.current.sampler)
        serve_with(client, gated)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            decoding = pool.submit(client.get, "/sample?digit=1&n=1")  # 1 row decoding
            assert gated.entered.wait(30)
            queued = pool.submit(client.get, "/sample?digit=2&n=1")  # 1 row waiting: 2 held
            wait_until(lambda: client.app.state.batcher.depth == 1)
            refused = client.get("/sample?digit=3&n=1")
            gated.release.set()
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1" and "full" in refused.json()["detail"]
            assert decoding.result().status_code == 200 and queued.result().status_code == 200
        assert "cvae_rejected_requests_total 1.0" in client.get("/metrics").text
