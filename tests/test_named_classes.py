"""Everything downstream of a model works with its classes' names, and in colour: one tiny run
on 8x8 RGB images of three named classes (cat, dog, bird), served by a real uvicorn, drawn by
`cvae sample --label`, and exported and verified (docs/service.md, docs/sampling.md,
docs/export.md).

The dataset is registered as a user's own (`specs.register`, no offline source): its
checkpoints and export carry its spec, and the server runs in a thread of this process.
"""

from __future__ import annotations

import io
import json
import logging
from urllib.parse import unquote

import httpx
import numpy as np
import pytest
from PIL import Image

from cvae import limits
from cvae.config import presets
from cvae.cli.main import main
from cvae.data import specs
from cvae.data.load import Dataset
from cvae.sampling.grid import grid_shape
from servers import uvicorn_in_thread
from service.app import create_app

PETS = specs.DatasetSpec("pets", "Pets (synthetic)", "pets", 8, 8, 3, ("cat", "dog", "bird"),
                         None, content_hash="synthetic-pets-of-tests-named-classes")
SHAPE = PETS.stored_shape  # (8, 8, 3)


def pet_images(labels: np.ndarray, seed: int) -> np.ndarray:
    """uint8[N, 8, 8, 3]: class c is a bright square in colour channel c, on faint noise."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 40, (len(labels), *SHAPE), dtype=np.uint8)
    for image, label in zip(images, labels):
        image[2:6, 2:6, label] = rng.integers(200, 256, (4, 4))
    return images


def pet_picture(label: int, side: int = 32) -> bytes:
    """A PNG upload of class `label`, larger than the model's images (the service fits it)."""
    picture = np.zeros((side, side, 3), np.uint8)
    picture[side // 4:3 * side // 4, side // 4:3 * side // 4, label] = 230
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def pets():
    """PETS registered as `cvae data --from` registers a dataset of one's own."""
    return specs.register(PETS)


@pytest.fixture(scope="module")
def colour_run(pets, tmp_path_factory):
    """The test config trained 2 epochs on 96 synthetic pets (16 held out): checkpoints in a
    folder of its own. About 10 s on 2 CPU cores."""
    from conftest import train_run

    rng = np.random.default_rng(0)
    train, test = rng.integers(0, 3, 96).astype(np.int32), rng.integers(0, 3, 32).astype(np.int32)
    data = Dataset(pet_images(train, 1), train, pet_images(test, 2), test, PETS.name)
    config = presets.test().replace(dataset=PETS.name, epochs=2)
    return train_run(tmp_path_factory.mktemp("pets-run"), config, data)


@pytest.fixture(scope="module")
def colour_export(colour_run, tmp_path_factory):
    """The folder `cvae export` wrote for the colour run (every artefact verified on writing:
    the StableHLO bits and ONNX Runtime's tolerance). About 15 s on 2 CPU cores."""
    from cvae.export.run import export_checkpoint

    folder = tmp_path_factory.mktemp("pets-export") / "export"
    export_checkpoint(colour_run.directory, folder, log=lambda message: None)
    return folder


def cvae(*argv: str) -> int:
    """`cvae ARGV` in this process, its logging set-up undone after (`main` points the root
    logger at the stderr of the moment, pytest's capture of this test)."""
    handlers = logging.root.handlers[:]
    try:
        return main(list(argv))
    finally:
        logging.root.handlers[:] = handlers


def png_of(content: bytes) -> tuple[tuple[int, int], str]:
    with Image.open(io.BytesIO(content)) as image:
        return image.size, image.mode


def default_grid(tiles: int, cols: int) -> tuple[int, int]:
    """(width, height) of a grid of PETS tiles at the default scale and pad."""
    height, width = grid_shape(tiles, cols, scale=limits.DEFAULT_SCALE, pad=limits.DEFAULT_PAD,
                               image_shape=SHAPE)
    return width, height


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_a_colour_run_is_served_and_drawn_by_class_name(colour_run, colour_export, tmp_path):
    """The run's checkpoints served by a real uvicorn; `cvae sample --label` on its export
    draws the served bytes (the export draws the run's pixels)."""
    out = tmp_path / "birds.png"
    assert cvae("sample", "--checkpoint-dir", str(colour_export), "--label", "bird", "--n", "5",
                "--seed", "2", "--scale", "2", "--out", str(out)) == 0
    assert cvae("sample", "--checkpoint-dir", str(colour_export), "--label", "cow",
                "--out", str(tmp_path / "cow.png")) == 2  # the line: test_class_names.py
    assert not (tmp_path / "cow.png").exists()
    with uvicorn_in_thread(create_app(colour_run.directory)) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        birds = client.get("/sample", params={"label": "2", "n": 5, "seed": 2, "scale": 2})
        assert birds.content == out.read_bytes()
        assert png_of(birds.content) == (grid_shape(5, 3, scale=2, image_shape=SHAPE)[::-1],
                                         "RGB")

        config = client.get("/readyz").json()["config"]
        assert config["class_names"] == ["cat", "dog", "bird"]
        assert config["image_shape"] == [8, 8, 3]

        dogs = client.get("/sample", params={"label": "dog", "n": 4, "seed": 3})
        assert dogs.status_code == 200, dogs.text
        assert png_of(dogs.content) == (default_grid(4, 2), "RGB")
        for same in ({"label": "1"}, {"digit": 1}):  # by index: the same class, the same bytes
            assert client.get("/sample", params={**same, "n": 4, "seed": 3}).content == \
                dogs.content
        every = client.get("/sample", params={"n": 2, "seed": 3})
        assert png_of(every.content) == (default_grid(6, 2), "RGB")  # one row per class

        unknown = client.get("/sample", params={"label": "cow"})
        assert unknown.status_code == 422
        assert unknown.json()["message"] == (
            "label: must be a class of this model: cat, dog, bird (or their indices 0..2) "
            "(got 'cow')")
        assert unknown.json()["detail"][0]["loc"] == ["query", "label"]
        both = client.get("/sample", params={"label": "dog", "digit": 1})
        assert both.status_code == 422 and both.json()["message"].startswith(
            "label: must be omitted when digit is given")
        assert "0..2 (this model's classes)" in client.get("/sample?digit=5").json()["message"]

        walk = client.get("/interpolate", params={"label": "bird", "seed": 1, "steps": 3})
        assert png_of(walk.content) == (default_grid(3, 3), "RGB")
        assert client.get("/interpolate?label=fish").status_code == 422

        reading = client.post("/classify", content=pet_picture(2))
        assert reading.status_code == 200, reading.text
        body = reading.json()
        assert body["class_names"] == ["cat", "dog", "bird"] and len(body["probabilities"]) == 3
        assert body["name"] == body["class_names"][body["label"]]

        carried = client.post("/transfer", params={"label": "dog", "show_input": "true"},
                              content=pet_picture(1))
        assert carried.status_code == 200, carried.text
        assert (carried.headers["x-label"], unquote(carried.headers["x-label-name"])) == \
            ("1", "dog")
        assert png_of(carried.content) == (default_grid(4, 4), "RGB")  # input, then 3 classes
        assert client.post("/transfer?label=cow", content=pet_picture(1)).status_code == 422

        mnist = client.post("/classify?prepare=mnist", content=pet_picture(0))
        assert mnist.status_code == 422 and mnist.json()["message"].startswith(
            "prepare: must be fit or none for this colour model")
        exact = client.post("/classify?prepare=none", content=pet_picture(0))
        assert exact.status_code == 422 and "takes a 8x8 image" in exact.json()["message"]
        assert client.post("/classify?prepare=none", content=pet_picture(0, side=8)
                           ).status_code == 200


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_the_export_says_the_shape_channels_and_class_names(colour_export):
    facts = {"image_shape": [8, 8, 3], "channels": 3, "class_names": ["cat", "dog", "bird"]}
    config = json.loads((colour_export / "config.json").read_text())
    manifest = json.loads((colour_export / "manifest.json").read_text())
    for written in (config, manifest):
        assert {key: written[key] for key in facts} == facts
    onnx = manifest["verification"]["onnx"]
    assert onnx["rows"] == 3000 and onnx["sample_max_uint8"] <= 1  # 1000 per class
    card = (colour_export / "README.md").read_text()
    assert "8x8 RGB images" in card and "0 `cat`, 1 `dog`, 2 `bird`" in card
    assert "(1,000 per class)" in card and "census" not in card
    assert 'label = sampler.class_names.index("bird")' in card  # its own classes' snippet
    assert png_of((colour_export / "samples.png").read_bytes())[1] == "RGB"


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_the_page_lists_the_classes_and_draws_a_colour_model_in_the_browser(colour_export):
    """The page's class picker holds the served names, and "draw in the browser" runs the
    export's sample.onnx and lays out RGB tiles: its pixels are the server's for its noise."""
    from selenium.webdriver.support.ui import Select
    from test_export_browser import load_and_switch_to_browser, require_browser_and_runtime

    from cvae.sampling.grid import _to_uint8
    from test_browser import headless_chromium, image_width

    require_browser_and_runtime()
    app = create_app(colour_export)
    with uvicorn_in_thread(app) as url, headless_chromium() as driver:
        load_and_switch_to_browser(driver, url)
        picker = Select(driver.find_element("id", "digit"))
        assert [option.text for option in picker.options][1:] == ["cat", "dog", "bird"]
        last = driver.execute_script(
            "const l = window.browserSampling.last; return {noise: Array.from(l.noise), "
            "labels: Array.from(l.labels), pixels: Array.from(l.pixels), rows: l.rows};")
        width = image_width(driver)
    sampler = app.state.watcher.current.sampler
    rows = last["rows"]
    assert rows == 24 and width == grid_shape(24, 8, scale=2, image_shape=SHAPE)[1]
    labels = np.asarray(last["labels"], np.int32)
    assert np.array_equal(labels, np.repeat(np.arange(3), 8))  # every class, n = 8
    noise = np.asarray(last["noise"], np.float32).reshape(rows, sampler.noise_dim)
    served = _to_uint8(sampler.decode(noise, labels), SHAPE).astype(int)
    drawn = np.asarray(last["pixels"], np.uint8).reshape(rows, *SHAPE).astype(int)
    assert np.abs(drawn - served).max() <= 1


def test_a_reading_answers_for_a_model_of_a_thousand_classes():
    """/classify's reply is bounded by no built-in dataset's ten classes (a 500 otherwise)."""
    from service.routes.classify import Reading

    names = [f"class {index}" for index in range(1000)]
    reading = Reading(probabilities=[0.001] * 1000, label=999, name=names[999],
                      class_names=names, step=1)
    assert reading.model_dump()["label"] == 999 and len(reading.probabilities) == 1000
