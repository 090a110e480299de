"""Flat configs of earlier versions, read through the one translation table
(`cvae.config.flat.LEGACY`): the shipped TOML files as the last flat version wrote them
(tests/fixtures/flat-configs, commit f00b456), the hand-written ones still in configs/, and a
checkpoint that version wrote (tests/fixtures/checkpoints-flat-config, gen.sh): a ladder with a
VampPrior and the logistic, each with options of its own."""

from __future__ import annotations

import io
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cvae.config import flat, presets
from cvae.config.sections import Config
from cvae.config.toml import load_config
from cvae.sampling.sampler import load_sampler

FIXTURES = Path(__file__).parent / "fixtures"
FLAT_RUN = FIXTURES / "checkpoints-flat-config" / "ladder-vamp"


@pytest.mark.parametrize("name", presets.PRESETS)
def test_each_flat_preset_file_loads_to_its_preset(name):
    assert load_config(None, FIXTURES / "flat-configs" / f"{name}.toml", {}) == \
        presets.get_preset(name)


def test_the_table_names_every_field_of_the_last_flat_version_once():
    written = tomllib.loads((FIXTURES / "flat-configs" / "default.toml").read_text())
    written.pop("preset", None)
    assert sorted(written) == sorted(flat.LEGACY)
    assert len(set(flat.LEGACY.values())) == len(flat.LEGACY) == 59


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "configs").glob("own-*")))
def test_the_hand_written_flat_files_still_load(path):
    config = load_config(None, path, {})
    assert config.validate() is config


def test_a_flat_checkpoint_reads_as_the_nested_config_it_meant():
    config = load_sampler(FLAT_RUN).config
    assert (config.model.name, config.prior.name, config.likelihood.name) == (
        "ladder", "vamp", "logistic")
    assert config.model.options.stochastic_layers == 2
    assert config.model.options.upper_latent_dim == 2
    assert config.prior.options.pseudo_inputs == 3
    assert Config.from_json(config.to_json()) == config


def test_a_flat_checkpoint_samples_the_picture_it_sampled(tmp_path):
    """The PNG `cvae sample` wrote with the flat version's code (gen.sh, on an AVX2 machine):
    byte for byte where this machine's kernels round as that one's did; on others (an AVX-512
    machine differed in one pixel by one grey level) within one grey level, in a handful of
    pixels. A config read wrongly draws other digits, far outside that."""
    sampler = load_sampler(shutil.copytree(FLAT_RUN, tmp_path / "run"))
    png = sampler.sample_png(None, 4, 3)
    recorded = (FLAT_RUN.parent / "ladder-vamp.png").read_bytes()
    if png == recorded:
        return
    drawn, kept = (np.asarray(Image.open(io.BytesIO(data)), np.int16) for data in (png, recorded))
    assert drawn.shape == kept.shape
    differs = np.abs(drawn - kept)
    assert differs.max() <= 1 and np.count_nonzero(differs) <= differs.size // 1000
