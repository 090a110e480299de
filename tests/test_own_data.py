"""cvae data --from: one's own images (an image folder, an .npz, IDX files) prepared into the data
folder with a manifest, bad inputs refused with one line and nothing written, the spec
registered from the manifest and carried by the checkpoint, and a few training steps on it.

The sources are small versions of the three example data sets (scripts/example_datasets.py):
scikit-learn's digits as an .npz, Fashion-MNIST-style PNG folders (from the synthetic IDX
digits), and the seeded 32x32 colour digits."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cvae.config import presets
from cvae.config.sections import Config
from cvae.data import prepared, specs
from cvae.data.load import load_dataset
from cvae.data.memory import MEMORY_ENV, check_fits
from cvae.cli.data import parse_image_size
from cvae.data.own import RESIZE_FILTER, prepare_own
from cvae.data.synthetic import write_synthetic_idx
from cvae.errors import ConfigError, DataError
from cvae.export.config_file import config_json, read_config
from cvae.data.specs import spec_of

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("example_datasets",
                                                  ROOT / "scripts" / "example_datasets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


examples = _load_script()


def prepare(source, name, data_dir, **options):
    """prepare_own, quiet: returns (folder, manifest, the lines it printed and warned)."""
    lines = []
    folder = prepare_own(source, name, data_dir, log=lines.append, warn=lines.append,
                         progress=False, **options)
    return folder, json.loads((folder / prepared.MANIFEST).read_text()), lines


def loaded(data_dir: Path, name: str):
    return load_dataset(data_dir, prepared.register_prepared(data_dir, name).name)


def rows(images: np.ndarray, labels) -> list[tuple[str, bytes]]:
    """(label, pixels) pairs in a fixed order: to compare two sets of images as sets."""
    return sorted((str(label), image.tobytes()) for image, label in zip(images, labels))


def all_rows(data, class_names) -> list[tuple[str, bytes]]:
    names = np.array(class_names)
    return rows(np.concatenate([data.train_images, data.test_images]),
                names[np.concatenate([data.train_labels, data.test_labels])])


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Small versions of the example data sets, and synthetic IDX files (a few dozen images)."""
    root = tmp_path_factory.mktemp("sources")
    idx = root / "idx"
    synthetic = write_synthetic_idx(idx, num_train=60, num_test=20)
    return {"digits": examples.write_digits(root / "digits.npz", limit=60),
            "colour": examples.write_colour(root / "colour.npz", limit=30, seed=0),
            "fashion": examples.write_fashion(root / "fashion", source=idx / "MNIST" / "raw"),
            "idx": idx / "MNIST" / "raw", "synthetic": synthetic}


def test_an_npz_round_trips_exactly_with_its_class_names_and_a_stated_seeded_split(
        sources, tmp_path):
    folder, manifest, lines = prepare(sources["digits"], "digits", tmp_path)
    with np.load(sources["digits"]) as npz:
        source_rows = rows(npz["images"], npz["class_names"][npz["labels"]])
    data = loaded(tmp_path, "digits")
    assert all_rows(data, manifest["class_names"]) == source_rows
    assert manifest["class_names"] == [str(d) for d in range(10)]
    assert manifest["image_shape"] == [8, 8, 1] and data.train_images.shape[1:] == (8, 8)
    assert manifest["split"] == {"rule": manifest["split"]["rule"], "test_fraction": 0.2,
                                 "seed": 0}
    assert sum(manifest["counts"]["test"].values()) == len(data.test_images) > 0
    assert manifest["resize"]["resized"] == {} and manifest["modes"]["converted"] == {}
    assert f"prepared {folder}" in lines[1]


def test_an_image_folder_with_train_and_test_levels_keeps_its_split_and_class_names(
        sources, tmp_path):
    _, manifest, _ = prepare(sources["fashion"], "fashion", tmp_path)
    data = loaded(tmp_path, "fashion")
    synthetic = sources["synthetic"]
    # Folder names (sorted, as torchvision's ImageFolder) name the classes; "/" became "-".
    names = [name.replace("/", "-") for name in specs.FASHION]
    assert manifest["class_names"] == sorted(names)
    assert manifest["split"] == {"rule": "the source's own (folder)"}
    for split, images, labels in (("train", synthetic.train_images, synthetic.train_labels),
                                  ("test", synthetic.test_images, synthetic.test_labels)):
        mine = (data.train_images, data.train_labels) if split == "train" else (
            data.test_images, data.test_labels)
        assert rows(mine[0], np.array(manifest["class_names"])[mine[1]]) == rows(
            images, np.array(names)[labels])


def test_idx_files_under_any_name_round_trip_in_order(sources, tmp_path):
    _, manifest, _ = prepare(sources["idx"], "my-idx", tmp_path)
    data, synthetic = loaded(tmp_path, "my-idx"), sources["synthetic"]
    np.testing.assert_array_equal(data.train_images, synthetic.train_images)
    np.testing.assert_array_equal(data.train_labels, synthetic.train_labels)
    np.testing.assert_array_equal(data.test_images, synthetic.test_images)
    np.testing.assert_array_equal(data.test_labels, synthetic.test_labels)
    assert manifest["source"]["kind"] == "idx"


def test_colour_images_round_trip_with_three_channels(sources, tmp_path):
    _, manifest, _ = prepare(sources["colour"], "colour", tmp_path)
    with np.load(sources["colour"]) as npz:
        source_rows = rows(npz["images"], npz["class_names"][npz["labels"]])
    data = loaded(tmp_path, "colour")
    assert all_rows(data, manifest["class_names"]) == source_rows
    assert data.train_images.shape[1:] == (32, 32, 3) and manifest["channels"] == 3


def test_the_example_script_makes_the_folder_it_writes_into(tmp_path):
    """A fresh clone has no runs/: the Results page's first command writes runs/colour.npz."""
    out = tmp_path / "runs" / "colour.npz"
    assert examples.main(["colour", str(out), "--limit", "3"]) == 0
    with np.load(out) as npz:
        assert npz["images"].shape == (3, 32, 32, 3)


def _mixed_folder(root: Path) -> dict[str, Image.Image]:
    """Two classes: four grey 6x4 images, one RGBA 10x8, one palette 6x4."""
    rng = np.random.default_rng(1)
    images = {}
    for i in range(4):
        images[f"a/{i}.png"] = Image.fromarray(rng.integers(0, 256, (6, 4), np.uint8))
    images["b/rgba.png"] = Image.fromarray(rng.integers(0, 256, (10, 8, 4), np.uint8))
    images["b/grey.bmp"] = Image.fromarray(rng.integers(0, 256, (6, 4), np.uint8))
    images["b/palette.gif"] = images["b/rgba.png"].convert("RGB").convert("P").resize((4, 6))
    for name, image in images.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / name)
    return images


def test_mixed_sizes_and_modes_are_resized_and_converted_as_the_manifest_says(tmp_path):
    images = _mixed_folder(tmp_path / "mixed")
    _, manifest, lines = prepare(tmp_path / "mixed", "mixed", tmp_path / "data",
                                 test_fraction=0.25)
    assert manifest["resize"]["rule"].startswith("the most common size")
    assert manifest["resize"]["size"] == [6, 4] and manifest["resize"]["resized"] == {"10x8": 1}
    assert manifest["resize"]["filter"] == "PIL.Image.Resampling.LANCZOS"
    assert manifest["modes"] == {
        "to": "RGB", "converted": {"L": 5, "P": 1, "RGBA": 1}, "grey_from_colour": 0,
        "rule": f"colour: {tmp_path / 'mixed' / 'b' / 'palette.gif'} has channels that differ"}
    data = loaded(tmp_path / "data", "mixed")
    # The RGBA noise, its random alpha composited onto the default white background.
    white = Image.new("RGBA", images["b/rgba.png"].size, (255, 255, 255, 255))
    composite = Image.alpha_composite(white, images["b/rgba.png"]).convert("RGB")
    expected = np.asarray(composite.resize((4, 6), RESIZE_FILTER))
    found = np.concatenate([data.train_images, data.test_images])
    assert any(np.array_equal(image, expected) for image in found)
    assert "resized 1 images to 6x4 (LANCZOS)" in lines[1]


def test_image_size_and_channels_flags_override_the_rule(tmp_path):
    images = _mixed_folder(tmp_path / "mixed")
    lab = Image.new("LAB", (4, 6), (60, 20, 90))  # Pillow has no LAB -> L: through RGB
    lab.save(tmp_path / "mixed" / "b" / "lab.tif")
    _, manifest, _ = prepare(tmp_path / "mixed", "grey16", tmp_path / "data",
                             image_size=parse_image_size("5x3"), channels=1)
    data = loaded(tmp_path / "data", "grey16")
    assert manifest["image_shape"] == [5, 3, 1] and data.train_images.shape[1:] == (5, 3)
    assert manifest["resize"]["rule"] == "--image-size"
    assert manifest["modes"]["converted"] == {"LAB": 1, "P": 1, "RGBA": 1}
    found = np.concatenate([data.train_images, data.test_images])
    for expected in (images["a/0.png"], lab.convert("RGB").convert("L")):
        resized = np.asarray(expected.resize((3, 5), RESIZE_FILTER))
        assert any(np.array_equal(image, resized) for image in found)
    with pytest.raises(argparse.ArgumentTypeError, match="expected N or HxW"):
        parse_image_size("0x3")


# --- transparency and grey saved as colour -------------------------------------------------

# A 2x3 RGBA image: opaque colour, fully transparent pixels hiding green (and hiding grey 7),
# and one pixel of grey 100 at alpha 128.
OPAQUE, HIDDEN, HALF = (200, 30, 60, 255), (0, 255, 0, 0), (100, 100, 100, 128)
RGBA_PIXELS = np.array([[OPAQUE, HIDDEN, HALF], [OPAQUE, HIDDEN, (7, 7, 7, 0)]], np.uint8)


def _transparent_folder(root: Path) -> Path:
    """Class a: two RGBA PNGs; class b: two palette PNGs whose entry 0 (blue) is transparent,
    entry 1 red."""
    for i in range(2):
        (root / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(RGBA_PIXELS, "RGBA").save(root / "a" / f"{i}.png")
        palette = Image.fromarray(np.array([[0, 1, 1], [1, 0, 0]], np.uint8), "P")
        palette.putpalette([0, 0, 255, 255, 0, 0] + [0, 0, 0] * 254)
        (root / "b").mkdir(parents=True, exist_ok=True)
        palette.save(root / "b" / f"{i}.png", transparency=0)
    return root


def _all_images(data_dir: Path, name: str) -> np.ndarray:
    data = loaded(data_dir, name)
    return np.concatenate([data.train_images, data.test_images])


@pytest.mark.parametrize("background, rgb", [(None, (255, 255, 255)), ("black", (0, 0, 0)),
                                             ("#102030", (16, 32, 48))])
def test_transparency_is_composited_onto_the_background_and_recorded(background, rgb,
                                                                      tmp_path):
    source = _transparent_folder(tmp_path / "icons")
    with Image.open(source / "b" / "0.png") as palette:
        assert palette.mode == "P" and palette.info.get("transparency") == 0
    options = {} if background is None else {"background": background}
    name = f"icons-{rgb[2]}"  # a name per content: the process registers each prepared set
    _, manifest, lines = prepare(source, name, tmp_path / "data", test_fraction=0.5,
                                 **options)
    assert manifest["channels"] == 3
    grey = round(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])
    assert manifest["background"] == {
        "colour": background or "white", "rgb": list(rgb), "grey": grey, "transparent": 4,
        "rule": "transparency alpha-composited onto it (PIL.Image.alpha_composite)"}
    assert f"composited 4 images with transparency onto {background or 'white'} {rgb}" in lines
    found = _all_images(tmp_path / "data", name)
    rgbas = [image for image in found if tuple(image[0, 0]) == OPAQUE[:3]]
    palettes = [image for image in found if tuple(image[1, 0]) == (255, 0, 0)]
    assert len(rgbas) == len(palettes) == 2
    for image in rgbas:  # opaque pixels as they were, transparent ones the background exactly
        assert [tuple(image[0, 1]), tuple(image[1, 1]), tuple(image[1, 2])] == [rgb] * 3
        half = 100 * 128 / 255 + np.array(rgb) * 127 / 255  # alpha 128 of 255
        assert np.all(np.abs(image[0, 2] - half) <= 1), image[0, 2]
    for image in palettes:
        np.testing.assert_array_equal(image, [[rgb, (255, 0, 0), (255, 0, 0)],
                                              [(255, 0, 0), rgb, rgb]])


def test_grey_images_with_alpha_become_the_backgrounds_grey_level(tmp_path):
    for i in range(4):
        (tmp_path / "grey" / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        pixels = np.array([[[90, 255], [90, 0]], [[5, 0], [5, 255]]], np.uint8)  # L, alpha
        Image.fromarray(pixels, "LA").save(tmp_path / "grey" / "ab"[i % 2] / f"{i}.png")
    for name, background, level in (("on-white", "white", 255), ("on-black", "black", 0),
                                    ("on-red", "red", 76)):  # red's luma: 0.299 x 255
        _, manifest, _ = prepare(tmp_path / "grey", f"la-{name}", tmp_path / "data",
                                 background=background, test_fraction=0.5)
        assert manifest["channels"] == 1 and manifest["background"]["grey"] == level
        assert manifest["modes"]["rule"] == "every image is in a grey mode"
        for image in _all_images(tmp_path / "data", f"la-{name}"):
            np.testing.assert_array_equal(image, [[90, level], [level, 5]])


def _grey_as_colour_folder(root: Path) -> tuple[Path, list[np.ndarray]]:
    """Grey digits saved as colour: RGB PNGs and RGB JPEGs whose three channels are equal."""
    rng = np.random.default_rng(3)
    greys = [rng.integers(0, 256, (8, 8), np.uint8) for _ in range(4)]
    for i, grey in enumerate(greys):
        (root / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(grey).convert("RGB").save(root / "ab"[i % 2] / f"{i}.png")
        Image.fromarray(grey).convert("RGB").save(root / "ab"[i % 2] / f"{i}.jpg", quality=75)
    return root, greys


def test_colour_files_with_equal_channels_become_grey_unless_channels_3(tmp_path):
    source, greys = _grey_as_colour_folder(tmp_path / "digits")
    for path in source.rglob("*.*"):
        with Image.open(path) as image:
            assert image.mode == "RGB", path
    _, manifest, lines = prepare(source, "grey-jpegs", tmp_path / "data", test_fraction=0.5)
    assert manifest["channels"] == 1 and manifest["modes"]["to"] == "L"
    assert manifest["modes"]["grey_from_colour"] == 8
    assert manifest["modes"]["rule"].startswith("grey: every colour image has three equal")
    assert ("8 colour images have three equal channels everywhere: prepared as grey "
            "(1 channel); --channels 3 keeps them in colour") in lines
    found = _all_images(tmp_path / "data", "grey-jpegs")
    assert found.shape == (8, 8, 8)
    for grey in greys:  # each PNG exactly, its level kept (not a luma of a luma)
        assert any(np.array_equal(image, grey) for image in found)
    _, manifest, lines = prepare(source, "grey-jpegs-rgb", tmp_path / "data", channels=3,
                                 test_fraction=0.5)
    assert manifest["channels"] == 3 and manifest["modes"]["rule"] == "--channels"
    assert manifest["modes"]["grey_from_colour"] == 0
    assert not any("equal channels" in line for line in lines)
    assert _all_images(tmp_path / "data", "grey-jpegs-rgb").shape == (8, 8, 8, 3)


def test_one_pixel_off_grey_keeps_a_folder_in_colour_and_an_npz_is_checked_too(tmp_path):
    source, greys = _grey_as_colour_folder(tmp_path / "digits")
    off = np.repeat(greys[1][..., None], 3, axis=2)
    off[7, 7, 2] ^= 1  # one channel of one pixel differs by one level
    Image.fromarray(off).save(source / "b" / "1.png")
    _, manifest, lines = prepare(source, "one-off", tmp_path / "data", test_fraction=0.5)
    assert manifest["channels"] == 3 and manifest["modes"]["grey_from_colour"] == 0
    assert manifest["modes"]["rule"] == f"colour: {source / 'b' / '1.png'} has channels that differ"
    assert not any("equal channels" in line for line in lines)
    images = np.repeat(np.stack(greys)[..., None], 3, axis=3)
    _, manifest, _ = prepare(_npz(tmp_path / "grey.npz", [0, 1, 0, 1], images=images),
                             "grey-npz", tmp_path / "data", test_fraction=0.5)
    assert manifest["channels"] == 1 and manifest["modes"]["grey_from_colour"] == 4
    assert sorted(image.tobytes() for image in _all_images(tmp_path / "data", "grey-npz")) == (
        sorted(grey.tobytes() for grey in greys))
    images[2, 0, 0, 0] ^= 1
    _, manifest, _ = prepare(_npz(tmp_path / "colour.npz", [0, 1, 0, 1], images=images),
                             "colour-npz", tmp_path / "data", test_fraction=0.5)
    assert manifest["channels"] == 3
    assert manifest["modes"]["rule"] == (f"colour: {tmp_path / 'colour.npz'}: image 2 has "
                                         f"channels that differ")


def test_cvae_data_takes_background_and_refuses_what_is_not_a_colour(tmp_path, capsys):
    from cvae.cli.main import main

    source = _transparent_folder(tmp_path / "icons")
    assert main(["data", "--from", str(source), "--name", "icons-navy", "--background",
                 "navy", "--test-fraction", "0.5", "--data-dir", str(tmp_path / "data")]) == 0
    manifest = json.loads((tmp_path / "data" / "icons-navy" / prepared.MANIFEST).read_text())
    assert manifest["background"]["rgb"] == [0, 0, 128]
    capsys.readouterr()
    for colour, message in (("nocolour", "--background 'nocolour': not a colour"),
                            ("#00000080", "--background '#00000080': must be opaque")):
        assert main(["data", "--from", str(source), "--name", "bad", "--background", colour,
                     "--data-dir", str(tmp_path / "data")]) == 2
        assert capsys.readouterr().err.startswith(f"cvae data: error: {message}")
    assert not (tmp_path / "data" / "bad").exists()


def _folder(root: Path, counts: dict[str, int], size=(4, 4)) -> Path:
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.new("L", size[::-1], 20 * i).save(root / name / f"{i}.png")
    return root


def _npz(path: Path, labels, class_names=None, images=None) -> Path:
    labels = np.asarray(labels)
    images = np.zeros((len(labels), 4, 4), np.uint8) if images is None else images
    extra = {} if class_names is None else {"class_names": np.array(class_names)}
    np.savez(path, images=images, labels=labels, **extra)
    return path


def _bad_inputs(root: Path) -> dict[str, tuple[Path, str, dict]]:
    """name -> (source, the message it must give, prepare options)."""
    not_image = _folder(root / "not-image", {"a": 2, "b": 2})
    (not_image / "a" / "notes.txt").write_text("hello")
    truncated = _folder(root / "truncated", {"a": 2, "b": 2})
    noise = np.random.default_rng(0).integers(0, 256, (32, 32), np.uint8)
    Image.fromarray(noise).save(truncated / "b" / "0.png")
    png = (truncated / "b" / "0.png").read_bytes()
    (truncated / "b" / "0.png").write_bytes(png[:len(png) // 2])
    empty = _folder(root / "empty", {"a": 2, "b": 0})
    split = _folder(root / "split" / "train", {"a": 2, "b": 2}).parent
    beside = _folder(root / "beside" / "train", {"a": 2, "b": 2}).parent
    _folder(beside / "test", {"a": 1})
    _folder(beside, {"c": 1})
    return {
        "not an image": (not_image, r"not-image/a/notes.txt: not an image that Pillow reads: "
                                    r"remove it, or pass --skip-bad", {}),
        "truncated": (truncated, r"truncated/b/0.png: does not decode", {}),
        "empty class": (empty, r"class 'b' has no training images", {}),
        "one class": (_folder(root / "one", {"a": 3}), r"1 class\(es\) found", {}),
        "label outside class_names": (_npz(root / "outside.npz", [0, 1, 2], ["x", "y"]),
                                      r"label 2 is outside class_names \(2 names", {}),
        "npz without labels": (root / "nolabels.npz", r"no array 'labels'", {}),
        "npz of floats": (_npz(root / "floats.npz", [0, 1], images=np.zeros((2, 4, 4))),
                          r"images must be uint8", {}),
        "train without test": (split, r"has train/ but no test/", {}),
        "a class beside train/ and test/": (beside, r"beside/c: beside train/ and test/", {}),
        "built-in name": (empty, r"--name 'mnist' is a built-in dataset", {"name": "mnist"}),
        "too large": (_folder(root / "large", {"a": 3, "b": 3}),
                      r"more than this machine can train on", {"env": "300"}),
    }


def test_each_bad_input_gives_one_line_and_leaves_the_data_dir_unchanged(tmp_path,
                                                                          monkeypatch):
    cases = _bad_inputs(tmp_path / "sources")
    np.savez(tmp_path / "sources" / "nolabels.npz", images=np.zeros((2, 4, 4), np.uint8))
    data_dir = tmp_path / "data"
    (data_dir / "kept").mkdir(parents=True)
    before = tree(data_dir)
    for case, (source, message, options) in cases.items():
        if "env" in options:
            monkeypatch.setenv(MEMORY_ENV, options["env"])
        with pytest.raises(DataError, match=message) as error:
            prepare_own(source, options.get("name", "mine"), data_dir, progress=False)
        monkeypatch.delenv(MEMORY_ENV, raising=False)
        assert "\n" not in str(error.value), case
        assert tree(data_dir) == before, case
    # A data dir that did not exist is not left behind either.
    with pytest.raises(DataError):
        prepare_own(cases["empty class"][0], "mine", tmp_path / "new", progress=False)
    assert not (tmp_path / "new").exists()


def test_an_existing_dataset_is_not_overwritten(tmp_path):
    source = _folder(tmp_path / "source", {"a": 2, "b": 2})
    folder, manifest, _ = prepare(source, "twice", tmp_path / "data")
    with pytest.raises(DataError, match="already exists: remove it, or choose another --name"):
        prepare_own(source, "twice", tmp_path / "data", progress=False)
    assert json.loads((folder / prepared.MANIFEST).read_text()) == manifest


def test_skip_bad_leaves_out_and_lists_the_files_that_do_not_decode(tmp_path):
    source = _bad_inputs(tmp_path / "sources")["not an image"][0]
    (source / "stray.jpg").write_bytes(b"\xff\xd8 not really")
    _, manifest, lines = prepare(source, "skipped", tmp_path / "data", skip_bad=True)
    skipped = {Path(entry["path"]).name: entry["reason"] for entry in manifest["skipped"]}
    assert skipped == {"notes.txt": "not an image that Pillow reads",
                       "stray.jpg": "not in a class folder"}
    assert [line for line in lines if line.startswith("skipped ")] == [
        f"skipped {entry['path']}: {entry['reason']}" for entry in manifest["skipped"]]
    assert sum(manifest["counts"]["train"].values()) + sum(
        manifest["counts"]["test"].values()) == 4


def test_the_hash_names_the_content_not_the_run(sources, tmp_path):
    hashes = [prepare(sources["digits"], name, tmp_path, **options)[1]["sha256"]
              for name, options in (("first", {}), ("again", {}), ("reseeded", {"seed": 1}))]
    assert hashes[0] == hashes[1] != hashes[2]
    assert re.fullmatch(r"[0-9a-f]{64}", hashes[0])


def test_the_spec_round_trips_as_json_and_registers_once(sources, tmp_path):
    prepare(sources["digits"], "registered", tmp_path)
    spec = prepared.register_prepared(tmp_path, "registered")
    assert spec.source is None and spec.content_hash and spec.class_names[3] == "3"
    assert specs.DatasetSpec.from_json(spec.to_json()) == spec
    assert specs.DatasetSpec.from_json(specs.MNIST.to_json()) == specs.MNIST
    assert specs.register(spec) is spec and specs.spec_of("registered") == spec
    with pytest.raises(DataError, match="already registered with other content"):
        specs.register(specs.DatasetSpec.from_dict(spec.to_dict() | {"content_hash": "other"}))
    with pytest.raises(DataError, match="'mnist' is built in"):
        specs.register(specs.DatasetSpec.from_dict(spec.to_dict() | {"name": "mnist"}))
    config = Config().replace(dataset="registered").validate()
    specs.check_config(config)
    assert spec_of(config.data.dataset) is spec
    assert read_config(config_json(config), "config.json") == config  # the export's file
    with pytest.raises(ConfigError, match="run `cvae data --from PATH --name unprepared`"):
        specs.check_config(Config().replace(dataset="unprepared").validate())


def test_the_memory_limit_is_a_share_of_the_machine_also_when_training_loads(
        sources, tmp_path, monkeypatch):
    check_fits(1000, where="x", memory=4000)
    with pytest.raises(DataError, match=r"x: 1001 B of images is more than this machine can "
                                        r"train on \(1000 B, 25% of its memory\)"):
        check_fits(1001, where="x", memory=4000)
    prepare(sources["digits"], "budgeted", tmp_path)
    spec = prepared.register_prepared(tmp_path, "budgeted")
    train_bytes = sum(prepared.read_manifest(tmp_path / "budgeted")["counts"]["train"].values()
                      ) * spec.pixels
    monkeypatch.setenv(MEMORY_ENV, str(4 * train_bytes))  # the training file fits exactly
    assert len(load_dataset(tmp_path, "budgeted", test=False).train_images) > 0
    monkeypatch.setenv(MEMORY_ENV, str(4 * train_bytes - 4))
    with pytest.raises(DataError, match="more than this machine can train on"):
        load_dataset(tmp_path, "budgeted", test=False)
    # At the CLI: one line, exit code 2, and no checkpoint dir made for the refused run.
    from cvae.cli.main import main

    run = tmp_path / "refused-run"
    assert main(["train", "--dataset", "budgeted", "--data-dir", str(tmp_path),
                 "--checkpoint-dir", str(run)]) == 2
    assert not run.exists()


@pytest.fixture(scope="module")
def own_run(sources, tmp_path_factory):
    """presets.test() trained for a few steps on the prepared digits: (data dir, run dir)."""
    from cvae.training.callbacks import Checkpointer
    from cvae.training.loop import train_and_evaluate

    root = tmp_path_factory.mktemp("own-run")
    prepare(sources["digits"], "digits-run", root / "data")
    data = loaded(root / "data", "digits-run")
    config = presets.test().replace(dataset="digits-run", validation_size=8, epochs=1)
    train_and_evaluate(config.validate(), data, root / "run", callbacks=[Checkpointer()])
    return root / "data", root / "run"


def test_a_prepared_dataset_trains_and_its_checkpoint_carries_the_spec(own_run):
    import orbax.checkpoint as ocp

    from cvae.model import store

    data_dir, run = own_run
    model = store.load_trained_model(run)
    assert model.config.data.dataset == "digits-run" and model.step > 0
    manager = store.open_read_only(run)
    stored = manager.restore(model.step, args=ocp.args.Composite(
        **{store.DATASET: ocp.args.JsonRestore()}))[store.DATASET]
    manager.close()
    manifest = prepared.read_manifest(data_dir / "digits-run")
    assert specs.DatasetSpec.from_dict(stored) == prepared.spec_of_manifest(manifest)
    record = store.read_record(run, model.step)
    assert record["dataset"]["manifest_sha256"] == manifest["sha256"]


def test_cvae_data_from_then_a_fresh_process_reads_the_model_without_the_data(own_run,
                                                                               sources,
                                                                               tmp_path):
    """One `cvae data --from` process; then the trained model read where no data folder is."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "cvae.cli", "data", "--from",
                           str(sources["colour"]), "--name", "colour", "--data-dir",
                           str(tmp_path / "data")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert "prepared " in done.stdout and "train on it: cvae train --dataset colour" in done.stdout
    refused = subprocess.run([sys.executable, "-m", "cvae.cli", "data", "--from",
                              str(sources["colour"]), "--name", "colour", "--data-dir",
                              str(tmp_path / "data")], capture_output=True, text=True, env=env,
                             cwd=tmp_path, check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"cvae data: error: {tmp_path / 'data' / 'colour'} already exists: remove it, or "
        f"choose another --name"]
    read = subprocess.run(
        [sys.executable, "-c", "import sys; from cvae.model.store import load_trained_model; "
         "from cvae.data.specs import spec_of; "
         "print(spec_of(load_trained_model(sys.argv[1]).config.data.dataset).class_names)",
         str(own_run[1])],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == str(tuple(str(d) for d in range(10)))


@pytest.mark.parametrize("flags, message", [
    (["--name", "mine"], "--name names a dataset prepared --from PATH: give --from too"),
    (["--from", "x.npz"], "--from PATH takes --name NAME (not --dataset, which names a "
                          "built-in)"),
    (["--from", "x.npz", "--name", "mine", "--dataset", "mnist"], "--from PATH takes --name"),
])
def test_cvae_data_says_which_flags_go_together(flags, message, tmp_path, capsys):
    from cvae.cli.main import main

    assert main(["data", "--data-dir", str(tmp_path / "data"), *flags]) == 2
    assert capsys.readouterr().err.startswith(f"cvae data: error: {message}")
    assert not (tmp_path / "data").exists()


def test_cvae_train_registers_a_prepared_dataset_named_by_a_flag_or_a_config_file(
        sources, tmp_path, capsys):
    from cvae.cli.main import main

    prepare(sources["digits"], "from-file", tmp_path / "data")
    (tmp_path / "run.toml").write_text('dataset = "from-file"\n')
    for flags in (["--dataset", "from-file"], ["--config", str(tmp_path / "run.toml")]):
        assert main(["train", "--data-dir", str(tmp_path / "data"), "--print-config",
                     "--epochs", "3", *flags]) == 0
        assert 'dataset = "from-file"' in capsys.readouterr().out
    assert main(["train", "--data-dir", str(tmp_path / "data"), "--dataset", "elsewhere",
                 "--print-config"]) == 2
    assert "run `cvae data --from PATH --name elsewhere`" in capsys.readouterr().err
