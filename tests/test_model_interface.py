"""What every model family answers (cvae/model/interface.py) and how the registry finds them
(cvae/config/components.py, cvae/model/registry.py): each registered family is a `Family` that
declares its `Options` and `widths(options)`, its widths read without building it agree with
the built model's, its parameter groups cover its own networks once each, and a family
registered at run time (or through CVAE_MODEL_FAMILIES) is one the config accepts by name."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from cvae.config import components, presets
from cvae.config.sections import Config, ConfigError
from cvae.data.specs import spec_of
from cvae.model import registry
from cvae.model.interface import Family, Terms
from cvae.model.registry import create_model, init_variables
from jitted import apply

# Shared by every family (the base class holds them): not any family's encoder or decoder.
SHARED = {"classifier", "pseudo_inputs", "learned"}
CONFIGS = {"cvae": presets.test().replace(hidden_sizes=(16,)),
           "ladder": presets.test().replace(hidden_sizes=(16,), model="ladder",
                                            stochastic_layers=3, upper_latent_dim=2),
           "hierarchical": presets.test().replace(model="hierarchical", width=8,
                                                  depths=(1, 2), latent_channels=2)}


def test_every_registered_family_has_a_config_here():
    assert set(components.names("model")) == set(components.REGISTRY["model"]) == set(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_family_answers_the_interface(name):
    config = CONFIGS[name].replace(labels="20", labelled_per_batch=4, prior="vamp",
                                   pseudo_inputs=2)
    family = components.component("model", name)
    assert issubclass(family, Family) and config.model.component is family
    assert isinstance(config.model.options, family.Options)
    model = create_model(config)
    assert type(model) is family
    noise_dim, code_dim = family.widths(config.model.options, spec_of(config.data.dataset))
    assert model.noise_dim == noise_dim == registry.noise_dim(config)
    assert model.code_dim == code_dim == registry.code_dim(config)
    variables = init_variables(model, jax.random.key(0))
    b = 3
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (b, 784)).astype(jnp.float32)
    y = jnp.array([1, 5, 9], jnp.int32)
    noise = jax.random.normal(jax.random.key(2), (2, b, model.noise_dim))
    terms = apply(model, variables, x, y, noise, method="terms")
    assert isinstance(terms, Terms)
    assert all(t.shape == (2, b) for t in (terms.log_px, terms.log_pz, terms.log_qz,
                                           terms.kl_rest))
    assert terms.kl_dims.shape[:2] == (2, b) and terms.kl_dims.shape[2] <= model.noise_dim
    assert apply(model, variables, x, y, noise, method="draws").shape == (2, b, model.noise_dim)
    mean, logvar = apply(model, variables, x, y, method="encode")
    assert mean.shape == logvar.shape == (b, model.code_dim)
    assert apply(model, variables, mean, y, method="decode").shape == (b, 784)
    assert apply(model, variables, noise[0], y, method="generate").shape == (b, 784)
    assert apply(model, variables, x, method="classify").shape == (b, 10)
    assert [a.shape for a in apply(model, variables, x, y, method="reconstruct")] == [
        (b, model.code_dim), (b, model.code_dim), (b,)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_parameter_groups_cover_the_familys_own_networks_once(name):
    config = CONFIGS[name].replace(labels="20", labelled_per_batch=4)
    if hasattr(config.model.options, "batch_norm"):  # its statistics are covered too
        config = config.replace(batch_norm=True)
    model = create_model(config)
    groups = model.PARAM_GROUPS
    assert set(groups) == {"encoder", "decoder"} and groups == registry.param_groups(config)
    assert not set(groups["encoder"]) & set(groups["decoder"])
    variables = init_variables(model, jax.random.key(0))
    for collection in ("params", "batch_stats"):
        for top in variables.get(collection, {}):
            base = re.sub(r"_\d+$", "", top)
            assert base in SHARED or base in groups["encoder"] + groups["decoder"], (
                collection, top)
    assert set(model.EXPORT_MODULES) == {"sample", "encode", "classify"}
    assert set(model.EXPORT_MODULES["sample"]) <= set(groups["decoder"])


def test_a_family_registered_at_run_time_is_one_the_config_accepts(monkeypatch):
    monkeypatch.setitem(components.REGISTRY["model"], "probe", "cvae.model.one_latent:OneLatent")
    assert "probe" in components.names("model")
    config = presets.test().replace(model="probe").validate()
    assert registry.noise_dim(config) == config.model.options.latent_dim
    assert type(create_model(config)).__name__ == "OneLatent"


def test_families_from_the_environment_are_registered_by_name(monkeypatch):
    monkeypatch.setitem(components.REGISTRY, "model", dict(components.REGISTRY["model"]))
    monkeypatch.setenv(components.ENVIRONMENT["model"], "probe = cvae.model.ladder:Ladder, ")
    assert components.names("model")[-1] == "probe"
    assert components.component("model", "probe").__name__ == "Ladder"


def test_an_unknown_family_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'flow'; known: cvae, ladder"):
        components.component("model", "flow")
    with pytest.raises(ConfigError, match="model='flow'"):
        Config().replace(model="flow").validate()


def test_a_family_gets_its_own_options_and_the_datas_shape_not_the_run():
    """No family, nor any of its networks, holds the whole config: each stage its section."""
    import dataclasses as dc

    from cvae.config.sections import Config
    from cvae.model.interface import Family

    for name in CONFIGS:
        model = create_model(CONFIGS[name])
        fields = {f.name: getattr(model, f.name) for f in dc.fields(model)
                  if f.name not in ("parent", "name")}
        assert not any(isinstance(value, Config) for value in fields.values()), name
        assert fields["options"] == CONFIGS[name].model.options
    assert "config" not in {f.name for f in dc.fields(Family)}
