
import logging
import tomllib
from pathlib import Path

import jax
import orbax.checkpoint as ocp
import pytest
from trees import tree_equal

from cvae.config import presets
from cvae.training.callbacks import Checkpointer
from cvae.training.checkpoints import (NO_METRICS_WARNING, create_manager, load_checkpoint,
                                       restore_state, save_checkpoint)
from cvae.errors import CheckpointError, ResumeError
from cvae.training.loop import train_and_evaluate
from cvae.model.registry import create_model
from cvae.training.optimizer import create_optimizer
from cvae.sampling.sampler import load_sampler
from cvae.data.synthetic import synthetic_dataset
from cvae.training.step import create_train_state, run_key

FIXTURES = Path(__file__).parent / "fixtures"


def make_state(config):
    optimizer, _ = create_optimizer(config, 100)
    return create_train_state(create_model(config), optimizer, config, key=run_key(config.run.seed))


def test_save_then_restore_is_exact_including_optimizer_state(tmp_path):
    config = presets.test().replace(ema_decay=0.9)
    state = make_state(config)
    state = state.replace(params=jax.tree.map(lambda p: p + 0.5, state.params), step=state.step + 7)
    manager = create_manager(tmp_path)
    save_checkpoint(manager, state, config, metrics={"loss": 1.5})
    manager.close()
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.step == 7 and checkpoint.config == config
    assert checkpoint.metrics == {"loss": 1.5}
    for name in ("params", "opt_state", "ema_params", "step", "key"):
        assert tree_equal(jax.device_get(getattr(state, name)),
                          jax.device_get(getattr(checkpoint.state, name))), name


def test_a_checkpoint_written_before_the_split_and_the_mixture_prior_still_loads(tmp_path):
    """The layout of older checkpoints: no `prior` in the state, no newer keys in the config."""
    config = presets.test()
    state = make_state(config)
    old_state = {name: getattr(state, name) for name in
                 ("step", "params", "opt_state", "batch_stats", "ema_params", "key")}
    newer = ("validation_size", "prior", "prior_components", "eval_every", "schedule_epochs",
             "truncation")
    # The test preset as the last flat version wrote it (a flat config, one key a setting).
    flat = tomllib.loads((FIXTURES / "flat-configs" / "test.toml").read_text())
    old_config = {k: v for k, v in flat.items() if k not in newer}
    manager = create_manager(tmp_path)
    manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(old_state),
                                            config=ocp.args.JsonSave(old_config),
                                            metrics=ocp.args.JsonSave({"loss": 1.0})))
    manager.wait_until_finished()
    manager.close()
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.step == 3 and checkpoint.metrics == {"loss": 1.0}
    assert checkpoint.config.data.validation_size == 0  # it trained on the whole training file
    assert checkpoint.config.prior.name == "standard" and checkpoint.state.prior == {}
    assert checkpoint.config.drawing.truncation == 1.0  # drawn as it always was
    assert tree_equal(jax.device_get(state.params), jax.device_get(checkpoint.state.params))
    assert load_sampler(tmp_path).sample_images(1, 2, seed=0).shape == (2, 28, 28)


def test_keeps_latest_three_and_the_best_by_validation_loss(tmp_path):
    config = presets.test()
    state = make_state(config)
    manager = create_manager(tmp_path, keep=3)
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 7.0}
    for step, loss in losses.items():
        # A "test_loss" that ranks the other way round must not matter: selection reads
        # validation figures only.
        save_checkpoint(manager, state.replace(step=step), config,
                        metrics={"validation_loss": loss, "test_loss": -loss, "loss": -loss})
    assert manager.all_steps() == [2, 4, 5, 6]
    assert manager.best_step() == 2 and manager.latest_step() == 6
    manager.close()


def test_restore_into_a_concrete_template(tmp_path, caplog):
    config = presets.test()
    state = make_state(config)
    manager = create_manager(tmp_path)
    # An interrupt's save, without metrics: Orbax's warning about them is not passed on.
    with caplog.at_level(logging.WARNING):
        save_checkpoint(manager, state, config, metrics=None)
    assert NO_METRICS_WARNING not in caplog.text
    restored, metrics = restore_state(manager, 0, state)
    assert tree_equal(jax.device_get(state.params), jax.device_get(restored.params))
    assert metrics == {}
    manager.close()


def test_missing_and_empty_dirs_say_where_and_what_to_run(tmp_path):
    with pytest.raises(CheckpointError, match="run `make train`"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint in .*empty.*make train"):
        load_checkpoint(tmp_path / "empty")


def test_corrupt_newest_step_falls_back_to_the_previous(tmp_path, caplog):
    config = presets.test().replace(epochs=2)
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Checkpointer()])
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [4, 8]
    for item in (tmp_path / "8" / "state").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.step == 4
    assert "skipping checkpoint step 8" in caplog.text


def test_resume_with_a_different_model_names_the_fields(tmp_path):
    config = presets.test()
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Checkpointer()])
    with pytest.raises(ResumeError, match="latent_dim: checkpoint 4 vs requested 8.*--fresh"):
        train_and_evaluate(config.replace(latent_dim=8), synthetic_dataset(80), tmp_path,
                           callbacks=[Checkpointer()])
    run = train_and_evaluate(config.replace(latent_dim=8), synthetic_dataset(80),
                             tmp_path, callbacks=[Checkpointer()], fresh=True)
    assert run.step == 4
    assert load_checkpoint(tmp_path).config.model.options.latent_dim == 8


def test_resume_continues_the_step_count(tmp_path):
    config = presets.test()
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Checkpointer()])
    run = train_and_evaluate(config.replace(epochs=3), synthetic_dataset(80), tmp_path,
                             callbacks=[Checkpointer()])
    assert run.step == 12
    assert load_checkpoint(tmp_path).step == 12


def test_training_resumes_past_a_corrupt_newest_step_and_keeps_it_aside(tmp_path):
    config = presets.test().replace(epochs=2)
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Checkpointer()])
    for item in (tmp_path / "8" / "state").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")
    run = train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Checkpointer()])
    assert run.start_step == 4 and run.step == 8
    assert load_checkpoint(tmp_path).step == 8
    assert len(list(tmp_path.glob("unreadable-8-*"))) == 1
