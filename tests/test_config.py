import tomllib
from pathlib import Path

import pytest

from cvae.config.presets import default, get_preset, likelihood, seed
from cvae.config.sections import Config, ConfigError

# The default config as the last flat version stored it (every one of its 59 fields): what a
# checkpoint or file written before the config was nested holds.
FLAT_DEFAULT = tomllib.loads(
    (Path(__file__).parent / "fixtures" / "flat-configs" / "default.toml").read_text())
FLAT_DEFAULT.pop("preset", None)


def test_json_round_trip_is_exact():
    config = default().replace(hidden_sizes=(64, 32), kl_weight=0.25, batch_norm=True)
    assert Config.from_json(config.to_json()) == config


def test_missing_newer_keys_take_defaults():
    values = default().to_dict()
    del values["optimizer"]["ema_decay"], values["objective"]["free_bits"]
    assert Config.from_dict(values) == default()
    flat = {k: v for k, v in FLAT_DEFAULT.items() if k not in ("ema_decay", "free_bits")}
    assert Config.from_dict(flat) == default()


def test_a_config_stored_before_the_pixel_sharpness_renders_the_plain_means():
    """Old checkpoints draw the pictures they drew; today's default sharpens; the presets
    measured before it keep the plain means."""
    values = {k: v for k, v in FLAT_DEFAULT.items() if k != "pixel_sharpness"}
    assert Config.from_dict(values).drawing.pixel_sharpness == 1.0
    assert default().drawing.pixel_sharpness == 1.3
    assert (seed().drawing.pixel_sharpness == get_preset("semi").drawing.pixel_sharpness
            == 1.0)


def test_unknown_keys_are_rejected_by_name():
    with pytest.raises(ConfigError, match="learnin_rate"):
        Config.from_dict({"learnin_rate": 0.1})
    with pytest.raises(ConfigError, match="optimizer.learnin_rate: unknown setting"):
        Config.from_dict({"optimizer": {"learnin_rate": 0.1}})


@pytest.mark.parametrize("field, value, fragment", [
    ("likelihood", "poisson", "likelihood='poisson': allowed bernoulli, gaussian"),
    ("batch_size", 0, "run.batch_size=0: must be >= 1"),
    ("learning_rate", -1.0, "optimizer.learning_rate=-1.0"),
    ("ema_decay", 1.0, "optimizer.ema_decay=1.0: must be in [0, 1)"),
    ("optimizer", "lbfgs", "optimizer.name='lbfgs'"),
    ("pixel_sharpness", 0.0, "drawing.pixel_sharpness=0.0: must be in (0, 10]"),
    ("pixel_sharpness", 11.0, "drawing.pixel_sharpness=11.0: must be in (0, 10]"),
    ("truncation", 0.0, "drawing.truncation=0.0: must be in (0, 1]"),
    ("truncation", 1.5, "drawing.truncation=1.5: must be in (0, 1]"),
])
def test_validation_names_the_field_and_range(field, value, fragment):
    with pytest.raises(ConfigError) as error:
        default().replace(**{field: value}).validate()
    assert fragment in str(error.value)


def test_seed_preset_is_the_seed_document_setup():
    config = seed()
    assert config.model.options.hidden_sizes == (256, 128, 64)
    assert config.model.options.latent_dim == 32
    assert config.likelihood.name == "gaussian"
    assert config.objective.kl_weight == 0.5
    assert (config.optimizer.name, config.optimizer.learning_rate,
            config.optimizer.lr_schedule) == ("adamw", 1e-4, "constant")
    assert config.run.batch_size == 16


def test_unknown_preset_lists_the_allowed_ones():
    with pytest.raises(ConfigError,
                       match="allowed default, seed, likelihood, likelihood-dreg, conv, semi, "
                             "test"):
        get_preset("huge")


def test_the_conv_preset_is_the_default_with_convolutions_for_100_epochs():
    """What docs/gpu.md measured: the default but for these two fields, so that the default's
    every other choice (sampler, split, schedule) carries over as the table says."""
    config = get_preset("conv")
    changed = {path: mine for path, (mine, _) in config.diff(default()).items()}
    assert changed == {"model.options.architecture": "conv", "run.epochs": 100}
    assert config.validate() == config


def test_command_line_strings_are_coerced():
    config = Config.from_dict({"hidden_sizes": "64,32", "batch_norm": "true", "epochs": "3"})
    assert (config.model.options.hidden_sizes == (64, 32)
            and config.model.options.batch_norm is True and config.run.epochs == 3)
    nested = Config.from_dict({"model": {"options": {"hidden_sizes": "64,32",
                                                     "batch_norm": "true"}},
                               "run": {"epochs": "3"}})
    assert (nested.model.options.hidden_sizes == (64, 32)
            and nested.model.options.batch_norm is True and nested.run.epochs == 3)


def test_semi_preset_is_100_labels_with_its_levers_and_round_trips():
    config = get_preset("semi")
    assert (config.labels.count, config.labels.labelled_count,
            config.labels.classifier_shift) == ("100", 100, 2)
    assert config.labels.classifier_weight == 5.0 and config.labels.consistency_weight == 20.0
    assert (config.labels.vat_weight, config.labels.vat_epsilon,
            config.labels.entropy_weight) == (3.0, 2.0, 1.0)
    assert config.validate() is config
    assert type(config).from_json(config.to_json()) == config


def test_a_config_without_the_semi_supervised_fields_trains_on_every_label():
    stored = {k: v for k, v in FLAT_DEFAULT.items()
              if k not in ("labels", "classifier_weight", "labelled_per_batch",
                           "classifier_shift", "consistency_weight", "entropy_weight",
                           "vat_weight", "vat_epsilon")}
    assert Config.from_dict(stored).labels.labelled_count is None
    nested = {k: v for k, v in get_preset("semi").to_dict().items() if k != "labels"}
    assert Config.from_dict(nested).labels.labelled_count is None


def test_model_lever_defaults_are_the_one_layer_elbo_model():
    config = default()
    assert (config.objective.bound, config.objective.importance_samples) == ("elbo", 1)
    assert config.prior.name == "mixture" and likelihood().prior.name == "mixture"
    assert config.model.name == "cvae"  # one stochastic layer: no depth to set
    assert not hasattr(config.model.options, "stochastic_layers")
    assert config.validate() == config


def test_a_config_stored_before_the_model_levers_loads_as_today():
    values = dict(FLAT_DEFAULT)
    for name in ("objective", "importance_samples", "stochastic_layers", "upper_latent_dim",
                 "pseudo_inputs", "model"):
        del values[name]
    assert Config.from_dict(values) == default()
    nested = default().to_dict()
    del nested["objective"]["bound"], nested["objective"]["importance_samples"]
    del nested["model"]
    assert Config.from_dict(nested) == default()


def test_a_config_stored_before_families_had_names_reads_its_family_from_its_depth():
    values = {**FLAT_DEFAULT, "stochastic_layers": 3}
    del values["model"]
    config = Config.from_dict(values)
    assert config.model.name == "ladder" and config.model.options.stochastic_layers == 3
    values = dict(FLAT_DEFAULT)
    del values["model"]
    assert Config.from_dict(values).model.name == "cvae"


@pytest.mark.parametrize("changes, fragment", [
    ({"objective": "vimco"}, "objective.bound='vimco': allowed elbo, iwae, dreg"),
    ({"prior": "flow"}, "prior='flow': allowed standard, mixture, vamp, learned_mixture"),
    ({"importance_samples": 0}, "objective.importance_samples=0: must be in [1, 256]"),
    ({"importance_samples": 1000}, "objective.importance_samples=1000: must be in [1, 256]"),
    ({"model": "ladder", "stochastic_layers": 6},
     "model.options.stochastic_layers=6: must be in [2, 5]"),
    ({"model": "ladder", "upper_latent_dim": 0},
     "model.options.upper_latent_dim=0: must be >= 1"),
    ({"prior": "vamp", "pseudo_inputs": 0}, "prior.options.pseudo_inputs=0: must be >= 1"),
])
def test_model_lever_validation_names_the_field(changes, fragment):
    with pytest.raises(ConfigError) as error:
        default().replace(**changes).validate()
    assert fragment in str(error.value)


def test_importance_samples_need_an_importance_weighted_objective():
    with pytest.raises(ConfigError, match="importance_samples=5: only with --objective"):
        default().replace(importance_samples=5).validate()
    assert default().replace(objective="iwae", importance_samples=5).validate()


@pytest.mark.parametrize("changes", [{"objective": "dreg", "importance_samples": 5},
                                     {"objective": "iwae", "importance_samples": 5},
                                     {"prior": "vamp"}, {"prior": "learned_mixture"},
                                     {"model": "ladder", "stochastic_layers": 2}])
def test_every_lever_validates_alone_and_with_the_combinations_once_refused(changes):
    """`check_trainable` refused these levers with --labels N and --batch-norm: they now train
    together (tests/test_model_combinations.py trains them), so the config takes them."""
    config = default().replace(**changes).validate()
    assert Config.from_json(config.to_json()) == config
    for more in ({"labels": "100"}, {"batch_norm": True}, {"dropout_rate": 0.2},
                 {"labels": "100", "batch_norm": True}):
        both = config.replace(**more).validate()
        assert Config.from_json(both.to_json()) == both


def test_the_ladder_validates_with_the_other_levers_convolutions_and_a_frozen_part():
    config = default().replace(model="ladder", stochastic_layers=3, objective="dreg",
                               importance_samples=5, prior="vamp").validate()
    assert (config.replace(architecture="conv").validate().model.options.architecture
            == "conv")
    assert config.replace(freeze="decoder").validate().optimizer.freeze == "decoder"


@pytest.mark.parametrize("changes, fragment", [
    ({"stochastic_layers": 2}, "stochastic_layers: an option of the model ladder, not of "
                               "this run's cvae (--model)"),
    ({"model": "ladder", "stochastic_layers": 1},
     "model.options.stochastic_layers=1: must be in [2, 5]"),
    ({"model": "flow"}, "model='flow': allowed cvae, ladder"),
    ({"objective": "iwae", "importance_samples": 5, "free_bits": 0.5},
     "free_bits=0.5: only with --objective elbo"),
    ({"objective": "dreg", "importance_samples": 5, "free_bits": 0.5},
     "free_bits=0.5: only with --objective elbo"),
    ({"model": "ladder", "stochastic_layers": 2, "objective": "dreg", "importance_samples": 2,
      "free_bits": 0.1}, "free_bits=0.1: only with --objective elbo"),
])
def test_what_validation_still_refuses_names_the_field(changes, fragment):
    """Free bits floor the ELBO's KL (the importance-weighted bounds have none), and a depth
    belongs to the ladder family alone."""
    with pytest.raises(ConfigError) as error:
        default().replace(**changes).validate()
    assert fragment in str(error.value)


def test_the_likelihood_presets_second_stage_is_the_same_model_under_dreg():
    """`make likelihood` starts --preset likelihood-dreg from a likelihood run's weights
    (--init-from): every field that shapes the parameters or the data must be the same."""
    first, second = likelihood(), get_preset("likelihood-dreg")
    assert first.diff(second) == {"objective.bound": ("elbo", "dreg"),
                                  "objective.importance_samples": (1, 5),
                                  "optimizer.learning_rate": (1e-3, 1e-4),
                                  "run.epochs": (640, 20)}
    assert second.validate() == second  # DReG with this model trains: nothing refuses it
