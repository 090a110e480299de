"""scripts/example_datasets.py's emoji set from a package shaped like `npm pack
emoji-datasource-google@16.0.0`'s (a few made-up emoji): split by base emoji, each with its
skin-tone variants, the PNGs kept byte for byte, then prepared with their transparency laid
over white."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from cvae.data.own import prepare_own

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("example_datasets",
                                              ROOT / "scripts" / "example_datasets.py")
examples = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(examples)


def _png(colour: tuple[int, int, int]) -> bytes:
    """A 64x64 RGBA disc of `colour`, transparent around it (the hidden pixels black)."""
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    pixels = np.asarray(image).copy()
    yy, xx = np.mgrid[:64, :64]
    pixels[(yy - 32) ** 2 + (xx - 32) ** 2 < 20**2] = (*colour, 255)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(out, format="PNG")
    return out.getvalue()


def _package(path: Path) -> dict[str, bytes]:
    """A .tgz like the npm package's: 6 base emoji in 2 categories, 9 skin-tone variants, one
    emoji without a Google image; the PNG bytes by file name."""
    entries, images = [], {}
    for i in range(6):
        unified = f"1F60{i}"
        entry = {"unified": unified, "image": f"{unified.lower()}.png", "has_img_google": True,
                 "category": "Smileys & Emotion" if i < 3 else "People & Body"}
        images[entry["image"]] = _png((40 * i, 200, 90))
        if i >= 3:
            entry["skin_variations"] = {
                tone: {"image": f"{unified.lower()}-{tone.lower()}.png", "has_img_google": True}
                for tone in ("1F3FB", "1F3FC", "1F3FD")}
            for variation in entry["skin_variations"].values():
                images[variation["image"]] = _png((200, 40 * i, 90))
        entries.append(entry)
    entries.append({"unified": "1F9FF", "image": "1f9ff.png", "has_img_google": False,
                    "category": "Objects"})
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [("package/emoji.json", json.dumps(entries).encode()),
                           *((examples.EMOJI_IMAGES + n, b) for n, b in images.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return images


def test_emoji_split_by_base_keeps_variants_with_their_base_and_the_pngs_as_they_are(tmp_path):
    images = _package(tmp_path / "package.tgz")
    out = examples.write_emoji(tmp_path / "emoji", tmp_path / "package.tgz", seed=3)
    written = {p.name: p for p in out.rglob("*.png")}
    assert sorted(written) == sorted(images)  # the emoji without a Google image is left out
    assert all(written[name].read_bytes() == data for name, data in images.items())
    for base in ("1f603", "1f604", "1f605"):  # each variant on its base's side, in its category
        sides = {written[n].parent for n in written if n.startswith(base)}
        assert len(sides) == 1 and sides.pop().name == "People & Body"
    for category in ("Smileys & Emotion", "People & Body"):
        assert (out / "train" / category).is_dir() and (out / "test" / category).is_dir()
    again = examples.write_emoji(tmp_path / "again", tmp_path / "package.tgz", seed=3)
    assert sorted(p.relative_to(again) for p in again.rglob("*.png")) == sorted(
        p.relative_to(out) for p in written.values())


def test_emoji_prepare_lays_transparency_over_white(tmp_path):
    _package(tmp_path / "package.tgz")
    out = examples.write_emoji(tmp_path / "emoji", tmp_path / "package.tgz")
    folder = prepare_own(out, "emoji", tmp_path / "data", log=lambda _: None,
                         warn=lambda _: None, progress=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["channels"] == 3 and manifest["background"]["transparent"] == 15
    pixels = np.load(folder / "train_images.npy")
    assert pixels.shape[1:] == (64, 64, 3)
    assert (pixels[:, 0, 0] == 255).all()  # the corners were transparent black
