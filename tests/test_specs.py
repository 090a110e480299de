"""cvae.data.specs: the registry is the one place a dataset is stated. Every registered dataset
can be prepared offline and is what `cvae data` and `cvae train` offer; and a dataset that exists
only here (2 classes of 8x8 images) flows through the config, loading, the grid, the sampler's
shapes, uploads, the service's label range, config.json and the model card, without training."""

import argparse
import dataclasses
import io
import json

import numpy as np
import pytest
from fastapi.exceptions import RequestValidationError
from PIL import Image

from cvae.cli.main import build_parser
from cvae.config import flat, settings
from cvae.config import sections as config_lib
from cvae.data import prepare, specs
from cvae.data.digit_image import prepare_digit
from cvae.data.idx import IDX_FILES, write_idx
from cvae.data.load import load_dataset
from cvae.errors import CheckpointError, ConfigError, DataError

TINY = specs.DatasetSpec("tiny", "Tiny", "Tiny", 8, 8, 1, ("left", "right"),
                         specs.OfflineSource("debian_idx", "dataset-tiny", "/nowhere"),
                         "someone/tiny")


@pytest.fixture
def tiny(monkeypatch):
    """TINY registered beside the real datasets, as a new entry of the registry would be."""
    monkeypatch.setitem(specs.SPECS, "tiny", TINY)
    config = config_lib.Config().replace(dataset="tiny", hidden_sizes=(8,), latent_dim=2)
    specs.check_config(config.validate())
    return config


def subcommand(name: str) -> argparse.ArgumentParser:
    actions = build_parser()._subparsers._group_actions  # noqa: SLF001 (argparse's own layout)
    return next(a for a in actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def dataset_choices(command: str) -> tuple:
    return next(a.choices for a in subcommand(command)._actions if a.dest == "dataset")


def test_cvae_data_offers_exactly_the_built_ins_and_train_also_prepared_names():
    assert tuple(dataset_choices("data")) == tuple(specs.SPECS) == ("mnist", "fashion_mnist")
    # `cvae train --dataset` also takes a name prepared by `cvae data --from`: the config
    # checks it once registered (tests/test_own_data.py).
    assert dataset_choices("train") is None
    hint = flat.all_leaves(config_lib.Config)["data.dataset"].hint
    assert settings.choices(hint) is None  # any name: no fixed choices


@pytest.mark.parametrize("name", sorted(specs.SPECS))
def test_every_dataset_names_a_preparer_and_a_package(name):
    spec = specs.spec_of(name)
    assert spec.source.kind in prepare.PREPARERS
    assert spec.source.package and spec.source.path
    assert spec.num_classes == len(set(spec.class_names)) and spec.pixels == 28 * 28


def test_an_unknown_dataset_names_the_registry():
    with pytest.raises(ValueError, match="known: mnist, fashion_mnist"):
        specs.spec_of("kmnist")
    with pytest.raises(ConfigError, match=r"not built in \(mnist, fashion_mnist\) and not "
                                          r"prepared: run `cvae data --from PATH --name kmnist`"):
        specs.check_config(config_lib.Config().replace(dataset="kmnist").validate())


def test_the_config_reads_the_class_count_of_its_dataset(tiny):
    assert specs.spec_of(tiny.data.dataset) is TINY
    four = tiny.replace(labels="4").validate()
    specs.check_config(four)
    assert four.labels.labelled_count == 4
    with pytest.raises(ConfigError, match="positive multiple of 2"):
        specs.check_config(tiny.replace(labels="5").validate())


def test_loading_checks_shapes_and_labels_against_the_spec(tiny, tmp_path):
    rng = np.random.default_rng(0)
    raw = tmp_path / "Tiny" / "raw"
    arrays = [rng.integers(0, 256, (6, 8, 8), dtype=np.uint8), np.array([0, 1] * 3, np.uint8),
              rng.integers(0, 256, (4, 8, 8), dtype=np.uint8), np.array([1, 0, 1, 0], np.uint8)]
    for name, array in zip(IDX_FILES, arrays):
        write_idx(raw / name, array)
    dataset = load_dataset(tmp_path, name="tiny")
    assert dataset.train_images.shape == (6, 8, 8) and dataset.test_labels.tolist() == [1, 0, 1, 0]
    write_idx(raw / IDX_FILES[3], np.array([1, 0, 2, 0], np.uint8))
    with pytest.raises(DataError, match=r"labels must be 0\.\.1, found 0\.\.2"):
        load_dataset(tmp_path, name="tiny")
    write_idx(raw / IDX_FILES[2], np.zeros((4, 28, 28), np.uint8))
    with pytest.raises(DataError, match=r"expected images of shape \[N, 8, 8\]"):
        load_dataset(tmp_path, name="tiny")


def test_the_sampler_draws_one_row_per_class_in_the_spec_shape(tiny):
    from cvae.sampling.grid import grid_shape
    from cvae.sampling.sampler import Sampler

    def decode(variables, z, labels):  # each image filled with its label's level
        return np.broadcast_to(np.asarray(labels, np.float32)[:, None, None], (len(z), 8, 8))

    sampler = Sampler(tiny, {}, decode)
    assert sampler.classes == (0, 1) and sampler.image_pixels == 64
    images = sampler.sample_images(None, 3, seed=0)
    assert images.shape == (6, 8, 8) and images[:3].max() == 0 and images[3:].min() == 1
    grid = np.asarray(Image.open(io.BytesIO(sampler.sample_png(None, 3, 0, scale=2, pad=1))))
    assert grid.shape == grid_shape(6, 3, scale=2, pad=1, image_shape=(8, 8)) == (35, 52)
    assert grid[1:17, 1:17].max() == 0 and grid[18:34, 1:17].min() == 255  # row 1 is class 1


def test_uploads_are_prepared_in_the_spec_shape():
    picture = np.zeros((40, 30), np.uint8)
    picture[5:35, 12:18] = 255
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    assert prepare_digit(buffer.getvalue(), shape=(8, 8)).shape == (8, 8)
    small = io.BytesIO()
    Image.fromarray(np.eye(8, dtype=np.uint8) * 255).save(small, format="PNG")
    assert prepare_digit(small.getvalue(), "none", shape=(8, 8)).shape == (8, 8)


def test_the_service_bounds_labels_by_the_served_class_count():
    from service.params import check_labels, describe_errors

    check_labels(2, digit=1, label=None, digits=(0, 1))
    with pytest.raises(RequestValidationError) as excinfo:
        check_labels(2, digit=2, digits=(1, 5))
    message = describe_errors(excinfo.value.errors())
    assert message == ("digit: must be an integer in 0..1 (this model's classes), or omitted "
                       "for one row per class (got '2'); digits: must be integers in 0..1 (this "
                       "model's classes), given 1 to 2 times (digits=3&digits=5), or omitted "
                       "for every class (got ['1', '5'])")


def test_config_json_carries_the_spec_and_is_checked_on_load(tiny):
    from cvae.export.config_file import config_json, read_config

    text = config_json(tiny)
    values = json.loads(text)
    assert values["image_shape"] == [8, 8, 1] and values["channels"] == 1
    assert values["class_names"] == ["left", "right"]
    assert read_config(text, "config.json") == tiny
    assert read_config(tiny.to_json(), "config.json") == tiny  # written before the facts
    with pytest.raises(CheckpointError, match="image_shape"):
        read_config(json.dumps({**values, "image_shape": [28, 28, 1]}), "config.json")


def test_the_model_card_names_the_spec_hub_id_and_title(tiny):
    from cvae.export.card import front_matter

    header = front_matter("tiny-cvae", tiny, [("nll", "-log p(x) (nats)", 1.5)])
    assert "datasets:\n- someone/tiny\n" in header
    assert 'name: "Tiny"' in header and "type: someone/tiny" in header
    without_hub = dataclasses.replace(TINY, hub_id=None)
    specs.SPECS["tiny"] = without_hub  # the fixture's monkeypatch restores the registry
    assert "datasets:\n- tiny\n" in front_matter("tiny-cvae", tiny, [])
