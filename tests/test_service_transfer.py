"""`POST /transfer` and `GET /interpolate` (service/routes/, service/uploads.py): the
pictures, their headers and caching, batching, and every bad upload, through TestClient."""

from __future__ import annotations

import concurrent.futures
import io
import socket

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from cvae.sampling.grid import grid_shape
from cvae.limits import MAX_INPUT_PIXELS, MAX_UPLOAD_BYTES
from service.app import create_app
from test_browser import uvicorn_in_thread
from test_digit_image import encoded, png_header_only, seven
from test_service import GatedDecoder, serve_with, wait_until


@pytest.fixture(scope="module")
def client(trained_run):
    with TestClient(create_app(trained_run.directory)) as client:
        yield client


@pytest.fixture(scope="module")
def digit_png(trained_run) -> bytes:
    return encoded(trained_run.data.test_images[0])


def tiles(content: bytes, count: int, cols: int, scale: int = 1, pad: int = 2) -> np.ndarray:
    """The PNG grid's tiles, uint8[count, 28*scale, 28*scale]; checks the grid's size first."""
    with Image.open(io.BytesIO(content)) as image:
        grid = np.asarray(image)
    height, width = grid_shape(count, cols, scale=scale, pad=pad)
    assert grid.shape == (height, width)
    size = 28 * scale
    return np.stack([grid[pad + r * (size + pad):pad + r * (size + pad) + size,
                          pad + c * (size + pad):pad + c * (size + pad) + size]
                     for r, c in (divmod(i, cols) for i in range(count))])


# ---- /transfer: the picture ---------------------------------------------------------------


@pytest.mark.parametrize("query, count, cols", [
    ("", 10, 10),  # the posterior mean as every digit, in one row
    ("show_input=true", 11, 11),  # led by the prepared input
    ("digits=3&digits=5&digits=3", 3, 3),
    ("samples=4&seed=1", 40, 10),  # one row per posterior draw
    ("samples=2&seed=1&show_input=true&digits=0&digits=1", 6, 3),
    ("cols=4&scale=2&pad=0", 10, 4),
])
def test_transfer_grid_geometry(client, digit_png, query, count, cols):
    response = client.post(f"/transfer?{query}", content=digit_png,
                           headers={"Content-Type": "image/png"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    scale = 2 if "scale=2" in query else 1
    tiles(response.content, count, cols, scale, pad=0 if "pad=0" in query else 2)


def test_input_tile_is_the_prepared_upload(client, trained_run):
    image = trained_run.data.test_images[1]
    response = client.post("/transfer?show_input=true&prepare=none", content=encoded(image))
    assert np.array_equal(tiles(response.content, 11, 11)[0], image)


def test_own_label_reconstructs_the_digit_closely(transfer_run):
    """With its own label the transfer is the model's reconstruction: mean squared error under
    0.012 on [0, 1] pixels (a black image scores 0.09 here), and closer than any other label."""
    data = transfer_run.data
    with TestClient(create_app(transfer_run.directory)) as client:
        for image, label in zip(data.test_images[:10], data.test_labels[:10]):
            response = client.post("/transfer?prepare=none", content=encoded(image))
            assert response.headers["x-label"] == str(label)  # read from the image alone
            errors = np.mean((tiles(response.content, 10, 10) / 255.0
                              - image / 255.0) ** 2, axis=(1, 2))
            assert errors[label] < 0.012, errors
            assert errors[label] < np.delete(errors, label).min(), errors


def test_given_label_is_used_and_reported(client, digit_png):
    for label in ("2", "9"):
        assert client.post(f"/transfer?label={label}", content=digit_png).headers[
            "x-label"] == label
    assert client.post("/transfer?label=2", content=digit_png).content != client.post(
        "/transfer?label=9", content=digit_png).content


# ---- /transfer: seeds, caching and batching -----------------------------------------------------


def test_seeded_transfer_bytes_are_stable_and_the_etag_covers_the_upload(client, trained_run,
                                                                         digit_png):
    query = "/transfer?samples=3&seed=4&show_input=true"
    first, again = client.post(query, content=digit_png), client.post(query, content=digit_png)
    assert first.content == again.content and first.headers["etag"] == again.headers["etag"]
    assert first.headers["x-seed"] == "4" and first.headers["cache-control"].startswith("public")
    assert first.headers["x-checkpoint-step"] == str(max(trained_run.steps))
    other_image = encoded(trained_run.data.test_images[2])
    assert client.post(query, content=other_image).headers["etag"] != first.headers["etag"]
    assert client.post("/transfer?samples=3&seed=5&show_input=true",
                       content=digit_png).content != first.content
    # The same picture in other bytes (here JPEG) is another upload: another tag.
    jpeg = encoded(Image.open(io.BytesIO(digit_png)).convert("L"), "JPEG", quality=95)
    assert client.post(query, content=jpeg).headers["etag"] != first.headers["etag"]
    # A POST is never 304 (see the route); the tag is there for clients to compare.
    cached = client.post(query, content=digit_png, headers={"If-None-Match": first.headers[
        "etag"]})
    assert cached.status_code == 200 and cached.content == first.content


def test_posterior_mean_needs_no_seed_and_random_draws_report_theirs(client, digit_png):
    mean = client.post("/transfer", content=digit_png)
    assert "x-seed" not in mean.headers and "etag" in mean.headers
    drawn = client.post("/transfer?samples=2", content=digit_png)
    seed = drawn.headers["x-seed"]
    assert drawn.headers["cache-control"] == "no-store" and "etag" not in drawn.headers
    assert client.post(f"/transfer?samples=2&seed={seed}", content=digit_png).content == \
        drawn.content


def test_transfers_batched_together_give_the_bytes_they_give_alone(client, trained_run):
    images = trained_run.data.test_images
    calls = [("/sample?digit=1&n=3&seed=2", None)]  # decoded alone, held by the gate
    calls += [(f"/transfer?samples={i % 3}&seed={i}&show_input=true", encoded(images[i]))
              for i in range(10)]
    calls += [(f"/interpolate?digit={i}&seed={i}&steps=4", None) for i in range(3)]
    calls += [("/sample?digit=2&n=5&seed=3", None), ("/interpolate?walk=digits&seed=8", None)]

    def call(target, path, body):
        return (target.post(path, content=body) if body else target.get(path)).content

    alone = [call(client, path, body) for path, body in calls]
    with TestClient(create_app(trained_run.directory, poll_interval=3600)) as batching:
        gated = GatedSampler(batching.app.state.watcher.current.sampler)
        serve_with(batching, gated)
        with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
            first = pool.submit(call, batching, *calls[0])
            assert gated.entered.wait(30)
            rest = [pool.submit(call, batching, *c) for c in calls[1:]]
            wait_until(lambda: batching.app.state.batcher.depth == len(calls) - 1)
            gated.release.set()
            together = [first.result()] + [f.result() for f in rest]
    assert together == alone


class GatedSampler(GatedDecoder):
    """`GatedDecoder` (its `decode` waits for `release`) with the rest of the sampler's methods
    (encoder, codes, prior) passed through."""

    def __getattr__(self, name):
        return getattr(self.sampler, name)


# ---- /transfer: bad uploads -------------------------------------------------------------------


def refused(response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["detail"][0]["loc"] == ["body"] and body["detail"][0]["type"] == kind
    assert body["message"].startswith("body: ")
    return body["message"]


# (body, status, error type, words its message contains): every upload the service refuses,
# shared with /classify, which must refuse them the same way
BAD_UPLOADS = [
    (b"", 415, "unsupported_media_type", "empty"),
    (b"not an image", 415, "unsupported_media_type", "not a PNG or JPEG"),
    (encoded(seven(), "GIF"), 415, "unsupported_media_type", "not a PNG or JPEG"),
    (encoded(seven())[:600], 422, "damaged_image", "truncated"),
    (encoded(seven().convert("RGB"), "JPEG")[:500], 422, "damaged_image", "truncated"),
    (encoded(Image.new("L", (280, 280), 255)), 422, "no_digit", "blank"),
    (png_header_only(6000, 6000), 413, "image_too_large", f"{MAX_INPUT_PIXELS:,}"),
    (png_header_only(200_000, 200_000), 413, "image_too_large", "decompression bomb"),
]


@pytest.mark.parametrize("body, status, kind, words", BAD_UPLOADS)
def test_bad_upload_gets_a_clear_message(client, body, status, kind, words):
    message = refused(client.post("/transfer", content=body), status, kind)
    assert words in message


def test_prepare_none_wants_28x28_and_not_blank(client):
    message = refused(client.post("/transfer?prepare=none", content=encoded(seven())), 422,
                      "wrong_size")
    assert "280x280" in message
    blank = encoded(np.zeros((28, 28), np.uint8))
    assert "blank" in refused(client.post("/transfer?prepare=none", content=blank), 422,
                              "no_digit")


def test_a_grid_over_the_pixel_bound_is_refused_before_the_upload_is_read(client):
    # 64 rows of 703 tiles at 8x: 163104x472 px = 77 MP, over the 64 MP of every grid route
    response = client.post("/transfer?samples=64&show_input=true&scale=8&pad=8&cols=703",
                           content=b"not even an image")
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["detail"][0]["loc"] == ["query", "samples"] and "MP" in body["message"]
    assert "lower samples, scale or pad" in body["message"]


def test_body_over_the_limit_is_413_whether_its_length_is_declared_or_not(client):
    too_big = b"\0" * (MAX_UPLOAD_BYTES + 1)
    message = refused(client.post("/transfer", content=too_big), 413, "body_too_large")
    assert f"{MAX_UPLOAD_BYTES:,} bytes" in message

    def chunked():  # no Content-Length: counted while reading
        for _ in range(MAX_UPLOAD_BYTES // 2**20 + 1):
            yield b"\0" * 2**20
    refused(client.post("/transfer", content=chunked()), 413, "body_too_large")
    assert client.post("/transfer", content=encoded(seven())).status_code == 200


def test_a_declared_oversized_body_is_refused_before_it_is_sent(trained_run):
    """A real server answers 413 from the headers alone: the client sends no body at all."""
    with uvicorn_in_thread(create_app(trained_run.directory)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /transfer HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                         b"Content-Length: %d\r\n\r\n" % (100 * MAX_UPLOAD_BYTES))
            reply = b""
            while b"body_too_large" not in reply:  # the head and the body may come apart
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 413 ") and b"body_too_large" in reply, reply


@pytest.mark.parametrize("query, names", [
    ("label=10", ["label"]), ("digits=12", ["digits"]), ("digits=x&samples=-1", ["digits",
                                                                                 "samples"]),
    ("samples=65", ["samples"]), ("prepare=crop", ["prepare"]), ("show_input=maybe",
                                                                   ["show_input"]),
    ("digits=1&digits=2&digits=3&digits=4&digits=5&digits=6&digits=7&digits=8&digits=9"
     "&digits=0&digits=1", ["digits"]),
    ("scale=9&pad=-1", ["scale", "pad"]), ("seed=-4", ["seed"]),
])
def test_bad_transfer_parameter_is_422_naming_it(client, digit_png, query, names):
    response = client.post(f"/transfer?{query}", content=digit_png)
    assert response.status_code == 422
    message = response.json()["message"]
    assert [part.split(":")[0] for part in message.split("; ")] == names
    assert "must be" in message


# ---- /interpolate ---------------------------------------------------------------------------


def test_latent_walk_ends_are_the_samples_of_its_two_seeds(client):
    walk = tiles(client.get("/interpolate?digit=7&seed=3&to_seed=9&steps=5").content, 5, 5)
    start = tiles(client.get("/sample?digit=7&n=1&seed=3").content, 1, 1)[0]
    end = tiles(client.get("/sample?digit=7&n=1&seed=9").content, 1, 1)[0]
    assert np.array_equal(walk[0], start) and np.array_equal(walk[-1], end)
    assert not np.array_equal(walk[2], start) and not np.array_equal(walk[2], end)


def test_digit_walk_column_is_the_sample_of_that_digit(client):
    walk = tiles(client.get("/interpolate?walk=digits&digit=4&seed=6&n=3").content, 30, 10)
    samples = tiles(client.get("/sample?digit=4&n=3&seed=6&cols=3").content, 3, 3)
    assert np.array_equal(walk[4::10], samples)


@pytest.mark.parametrize("query, count, cols", [
    ("seed=1", 100, 10),  # one row per digit, 10 steps
    ("seed=1&digit=2&steps=7&cols=3&scale=2", 7, 3),
    ("walk=digits&seed=1", 10, 10),
    ("walk=digits&seed=1&n=2&cols=5", 20, 5),
])
def test_interpolate_geometry(client, query, count, cols):
    response = client.get(f"/interpolate?{query}")
    assert response.status_code == 200, response.text
    tiles(response.content, count, cols, 2 if "scale=2" in query else 1)


def test_seeded_walk_is_cached_like_a_sample(client):
    first = client.get("/interpolate?digit=5&seed=2&steps=4")
    etag = first.headers["etag"]
    assert client.get("/interpolate?digit=5&seed=2&steps=4", headers={
        "If-None-Match": etag}).status_code == 304
    assert client.get("/interpolate?digit=5&seed=2&steps=4&to_seed=3").headers["etag"] == etag
    for other in ("digit=5&seed=2&steps=5", "digit=5&seed=2&steps=4&to_seed=4",
                  "digit=5&seed=2&steps=4&walk=digits"):
        assert client.get(f"/interpolate?{other}").headers["etag"] != etag, other
    drawn = client.get("/interpolate?digit=5")
    assert drawn.headers["cache-control"] == "no-store"
    assert client.get(f"/interpolate?digit=5&seed={drawn.headers['x-seed']}").content == \
        drawn.content


@pytest.mark.parametrize("query, name", [
    ("walk=sideways", "walk"), ("steps=1", "steps"), ("steps=65", "steps"),
    ("to_seed=-1", "to_seed"), ("n=0", "n"), ("digit=10", "digit"),
])
def test_bad_interpolate_parameter_is_422_naming_it(client, query, name):
    response = client.get(f"/interpolate?{query}")
    assert response.status_code == 422
    assert response.json()["message"].startswith(f"{name}: must be ")


def test_huge_digit_walk_is_refused_like_a_huge_sample(client):
    response = client.get("/interpolate?walk=digits&n=1024&scale=8")
    assert response.status_code == 422 and "MP" in response.json()["message"]


# ---- documentation ------------------------------------------------------------------------------


def test_openapi_documents_the_upload_and_its_limits(client):
    paths = client.get("/openapi.json").json()["paths"]
    transfer = paths["/transfer"]["post"]
    body = transfer["requestBody"]
    assert set(body["content"]) == {"image/png", "image/jpeg"}
    assert f"{MAX_UPLOAD_BYTES:,} bytes" in body["description"]
    assert f"{MAX_INPUT_PIXELS:,} pixels" in body["description"]
    assert {"200", "413", "415", "422", "503"} <= set(transfer["responses"])
    assert "304" not in transfer["responses"]
    assert "X-Label" in transfer["responses"]["200"]["headers"]
    assert {"200", "304", "422", "503"} <= set(paths["/interpolate"]["get"]["responses"])
