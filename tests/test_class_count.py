"""No class count assumed (docs/design.md, "HTTP service"): a model of 2 to `MAX_CLASSES`
classes is served, drawn and checked with its own classes, by index or by name, never MNIST's
ten. Two tiny runs on synthetic data of one's own shape (tests/shaped_data.py): twelve classes,
served by a real `cvae serve` process, and two, whose start-up block check must decode only the
labels it has. About 45 CPU-seconds (40 to 55 measured, the server process included), most
of it the server's start-up and the two trainings.
"""

from __future__ import annotations

import dataclasses
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from cvae import limits
from cvae.config import presets
from cvae.data import specs
from cvae.data.own import prepare_own
from cvae.errors import ConfigError, DataError
from cvae.sampling import blocks
from cvae.sampling.grid import grid_shape
from cvae.sampling.sampler import load_sampler
from cvae.sampling.latents import request_latents
from servers import cvae_server
from shaped_data import shaped_dataset, shaped_spec

# Own datasets (no offline source), as `cvae data --from` registers them: their checkpoints
# carry the spec, so a `cvae serve` process reads them without the data.
TWELVE = dataclasses.replace(shaped_spec("twelve-classes", 12, 12, 1, 12),
                             content_hash="synthetic-twelve-of-tests-class-count")
TWO = dataclasses.replace(shaped_spec("two-classes", 8, 8, 1, 2),
                          content_hash="synthetic-two-of-tests-class-count")


def trained(tmp_path_factory, spec: specs.DatasetSpec):
    """The test config trained one epoch on 96 images of `spec` (16 held out): a few seconds."""
    from conftest import train_run

    specs.register(spec)
    config = presets.test().replace(dataset=spec.name)
    return train_run(tmp_path_factory.mktemp(spec.name), config, shaped_dataset(spec, 96))


@pytest.fixture(scope="module")
def twelve_run(tmp_path_factory):
    return trained(tmp_path_factory, TWELVE)


@pytest.fixture(scope="module")
def two_run(tmp_path_factory):
    return trained(tmp_path_factory, TWO)


def picture(side: int = 40) -> bytes:
    """A PNG upload: a dark bar on white, as someone would draw one."""
    pixels = np.full((side, side), 255, np.uint8)
    pixels[side // 4:3 * side // 4, side // 2 - 3:side // 2 + 3] = 0
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def png_size(content: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(content)) as image:
        return image.size


def grid_size(tiles: int, cols: int) -> tuple[int, int]:
    """(width, height) of a grid of TWELVE's tiles at the default scale and pad."""
    height, width = grid_shape(tiles, cols, scale=limits.DEFAULT_SCALE, pad=limits.DEFAULT_PAD,
                               image_shape=TWELVE.stored_shape)
    return width, height


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_a_twelve_class_model_is_served_with_its_own_classes(twelve_run, tmp_path):
    """Classes 10 and 11 by index as well as by name, all twelve in one transfer and one
    reading, and a label past the model's classes (or past any model's) refused with its range."""
    names = list(TWELVE.class_names)
    with cvae_server(twelve_run.directory, tmp_path / "server.log") as server, \
            httpx.Client(base_url=server.url, timeout=120) as client:
        eleven = client.get("/sample", params={"digit": 11, "n": 3, "seed": 4})
        assert eleven.status_code == 200, eleven.text
        assert png_size(eleven.content) == grid_size(3, 2)
        by_name = client.get("/sample", params={"label": "c11", "n": 3, "seed": 4})
        assert by_name.content == eleven.content
        every = client.get("/sample", params={"n": 2, "seed": 1})  # one row per class
        assert png_size(every.content) == grid_size(24, 2)

        transfer = client.post("/transfer", params={"digits": list(range(12)), "label": "c3"},
                               content=picture())
        assert transfer.status_code == 200, transfer.text
        assert png_size(transfer.content) == grid_size(12, 12)
        assert transfer.headers["x-label"] == "3"
        default = client.post("/transfer", content=picture())  # omitted: every class
        assert default.status_code == 200 and png_size(default.content) == grid_size(12, 12)
        assert 0 <= int(default.headers["x-label"]) < 12  # the best ELBO of the twelve

        reading = client.post("/classify", content=picture())
        assert reading.status_code == 200, reading.text
        body = reading.json()
        assert len(body["probabilities"]) == 12 and body["class_names"] == names
        assert abs(sum(body["probabilities"]) - 1) < 1e-4
        assert body["name"] == names[body["label"]]

        walk = client.get("/interpolate", params={"walk": "digits", "digit": 10, "seed": 2})
        assert walk.status_code == 200 and png_size(walk.content) == grid_size(12, 12)

        for method, path, params in [("GET", "/sample", {"digit": 12}),
                                     ("GET", "/sample", {"digit": 1000}),  # past MAX_CLASSES
                                     ("GET", "/interpolate", {"digit": 12}),
                                     ("POST", "/transfer", {"digits": [3, 12]})]:
            refused = client.request(method, path, params=params, content=picture())
            assert refused.status_code == 422, (path, params)
            name = next(iter(params))
            assert refused.json()["message"].startswith(
                f"{name}: must be {'an integer' if name == 'digit' else 'integers'} in 0..11 "
                f"(this model's classes)"), refused.json()
            assert refused.json()["detail"][0]["loc"] == ["query", name]


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_a_two_class_models_block_check_decodes_only_its_two_labels(two_run):
    """`Sampler.check_blocks` (every start-up) runs each function on test rows labelled by the
    model's classes: 0 and 1 here, never a label of MNIST's ten; and keeps what it kept."""
    sampler = load_sampler(two_run.directory)  # checked once already, as the service loads it
    assert sampler.classes == (0, 1)
    seen: set[int] = set()

    def recording(fn):
        def run(variables, rows, labels):
            seen.update(np.asarray(labels).tolist())
            return fn(variables, rows, labels)
        return None if fn is None else run

    watched = dataclasses.replace(
        sampler, decode_fn=recording(sampler.decode_fn), encode_fn=recording(sampler.encode_fn),
        code_decode_fn=recording(sampler.code_decode_fn), prior_fn=recording(sampler.prior_fn),
        block_sizes=blocks.DECODE_BLOCKS, classify_block_sizes=blocks.ROW_BY_ROW)
    assert {probe.classes for probe in blocks.sampler_probes(watched)} == {2}
    watched.check_blocks()
    assert seen == {0, 1}
    assert (watched.block_sizes, watched.kernel_signature) == (sampler.block_sizes,
                                                                sampler.kernel_signature)
    # What it keeps holds: a row's bits alone are its bits among others, for both labels.
    noise, labels = request_latents(5, sampler.classes, 40, noise_width=sampler.noise_dim,
                                    temperature=1.0)
    together = sampler.decode(noise, labels)
    for row in (0, 39, 40, 79):
        alone = sampler.decode(noise[row:row + 1], labels[row:row + 1])
        assert alone.tobytes() == together[row:row + 1].tobytes()
    with pytest.raises(ConfigError, match=r"this model's classes are 0\.\.1"):
        sampler.sample_images(2, 1, 0)  # `cvae sample --digit 2` on it


def test_a_dataset_of_more_classes_than_any_model_takes_is_refused(tmp_path):
    labels = np.arange(limits.MAX_CLASSES + 1)
    np.savez(tmp_path / "many.npz", images=np.zeros((len(labels), 4, 4), np.uint8),
             labels=labels)
    with pytest.raises(DataError, match=r"1001 classes found: a model takes at most 1,000"):
        prepare_own(tmp_path / "many.npz", "many", tmp_path / "data", progress=False)
    assert not (tmp_path / "data").exists()
