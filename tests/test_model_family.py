"""A family and a prior registered by a test alone, each with two options of its own, go through
every stage: the flags, `--print-config` and a TOML file, train, resume, the run record, the
service's /sample, `cvae eval` and `cvae export` with its card (tests/toy_family.py,
tests/toy_prior.py). Nothing in the project names them."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvae.cli.main import build_parser
from cvae.cli.train import config_from_args
from cvae.config import components
from cvae.config.sections import Config
from cvae.config.toml import load_config, to_toml
from cvae.data.synthetic import synthetic_dataset
from cvae.training.callbacks import Checkpointer
from cvae.training.checkpoints import load_checkpoint
from cvae.training.loop import train_and_evaluate


TOY_FLAGS = ["--preset", "test", "--model", "toy", "--toy-hidden", "6", "--prior", "toy_prior",
             "--toy-components", "3", "--epochs", "2"]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(components.REGISTRY["model"], "toy", "toy_family:Toy")
    monkeypatch.setitem(components.REGISTRY["prior"], "toy_prior", "toy_prior:ToyPrior")


@pytest.fixture
def toy(registered):
    return config_from_args(build_parser("test").parse_args(["train", *TOY_FLAGS]))


def test_their_options_are_flags_settings_and_a_toml_table(registered, tmp_path):
    parser = build_parser("test")
    help_text = parser._subparsers._group_actions[0].choices["train"].format_help()
    assert "model options (toy)" in help_text and "--toy-hidden N" in help_text
    assert "prior options (toy_prior)" in help_text and "--toy-codes" in help_text
    config = config_from_args(parser.parse_args(["train", *TOY_FLAGS]))
    assert config.model.options.toy_hidden == 6 and config.model.options.toy_latent == 3
    assert config.prior.options.toy_components == 3 and config.prior.options.toy_codes == "means"
    text = to_toml(config)
    assert "[model.options]\n# The toy family's latent width.\ntoy_latent = 3" in text
    assert "[prior.options]" in text and "toy_components = 3" in text
    (tmp_path / "toy.toml").write_text(text)
    assert load_config(None, tmp_path / "toy.toml", {}) == config
    assert Config.from_json(config.to_json()) == config


def test_an_option_of_another_component_is_refused(registered):
    from cvae.errors import ConfigError

    with pytest.raises(ConfigError, match="toy_hidden: an option of the model toy, not of "
                                          "this run's cvae"):
        config_from_args(build_parser("test").parse_args(["train", "--toy-hidden", "6"]))


def test_nothing_in_the_project_names_them():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for folder in ("cvae", "service", "docs", "bench"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            assert not any(word in text for word in ("toy_family", "toy_prior", "toy_hidden",
                                                      "toy_components")), path


def _params(directory):
    return jax.tree.leaves(load_checkpoint(directory).state.params)


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_a_test_only_family_trains_resumes_serves_evaluates_and_exports(toy, data_dir, tmp_path):
    from cvae.evaluation.run import EvalOptions, run_eval
    from cvae.export.manifest import verify_folder
    from service.app import create_app

    data = synthetic_dataset(80)
    whole, parted = tmp_path / "whole", tmp_path / "parted"
    train_and_evaluate(toy, data, whole, callbacks=[Checkpointer()])
    train_and_evaluate(toy.replace(max_steps=4), data, parted, callbacks=[Checkpointer()])
    train_and_evaluate(toy, data, parted, callbacks=[Checkpointer()])
    assert load_checkpoint(parted).step == load_checkpoint(whole).step == 8
    for a, b in zip(_params(whole), _params(parted), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    assert "toy_hidden = 6" in next(whole.glob("*/config.toml")).read_text()
    assert load_checkpoint(whole).config == toy

    with TestClient(create_app(whole)) as client:
        response = client.get("/sample", params={"digit": 3, "n": 4, "seed": 1})
        assert response.status_code == 200
        assert response.content.startswith(b"\x89PNG")

    results = run_eval(whole, data_dir, EvalOptions(iwae_k=10, test_limit=32, fidelity=False),
                       json_path=tmp_path / "eval.json")
    assert np.isfinite(results["iwae"]["nll_conditional"])

    from cvae.export.run import export_checkpoint
    manifest = export_checkpoint(whole, tmp_path / "export", log=lambda message: None)
    assert manifest["files"]
    verify_folder(tmp_path / "export")
    card = (tmp_path / "export" / "README.md").read_text()
    assert "--model toy" in card and "--toy-hidden 6" in card and "--toy-components 3" in card
