import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trees import tree_equal

from cvae.config import presets
from cvae.training.callbacks import Callback, Checkpointer, NanGuard
from cvae.training.checkpoints import load_checkpoint
from cvae.errors import ResumeError
from cvae.training.loop import train_and_evaluate
from cvae.model.registry import create_model
from cvae.training.optimizer import create_optimizer
from cvae.data.synthetic import synthetic_dataset
from cvae.training.step import (create_train_chunk, create_train_step, epoch_permutation, run_key,
                                to_batch)
from cvae.training.supervision import FullLabels

def setup(config):
    model = create_model(config)
    optimizer, _ = create_optimizer(config, 1000)
    key = run_key(config.run.seed)
    state, train_step = create_train_step(model, optimizer, config, key=key,
                                          supervision=FullLabels(config))
    return key, state, train_step


def test_one_step_gives_finite_metrics_and_advances_the_step():
    config = presets.test()
    key, state, train_step = setup(config)
    data = synthetic_dataset(32)
    batch = to_batch(jnp.asarray(data.train_images[:16].reshape(16, 784)),
                     jnp.asarray(data.train_labels[:16]))
    state, metrics = train_step(state, batch, key)
    assert int(state.step) == 1
    for name in ("loss", "reconstruction", "kl", "grad_norm", "kl_weight"):
        assert np.isfinite(float(metrics[name])), name
    assert float(metrics["loss"]) == pytest.approx(
        float(metrics["reconstruction"] + metrics["kl_weight"] * metrics["kl"]), rel=1e-5)


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_loss_falls_on_a_tiny_synthetic_set(likelihood):
    config = presets.test().replace(likelihood=likelihood, learning_rate=3e-3)
    key, state, train_step = setup(config)
    data = synthetic_dataset(256)
    images, labels = jnp.asarray(data.train_images.reshape(-1, 784)), jnp.asarray(data.train_labels)
    chunk = create_train_chunk(train_step, config.run.batch_size, max_steps=16)
    order = epoch_permutation(key, 0, 256)
    state, first = chunk(state, images, labels, order, 0, key, num_steps=16)
    for epoch in range(1, 6):
        state, last = chunk(state, images, labels, epoch_permutation(key, epoch, 256), 0, key,
                            num_steps=16)
    assert np.all(np.isfinite(last["loss"]))
    assert float(np.mean(last["loss"])) < 0.8 * float(np.mean(first["loss"]))


def test_fused_chunk_equals_single_steps():
    config = presets.test()
    key, state_a, train_step = setup(config)
    _, state_b, _ = setup(config)
    data = synthetic_dataset(80)
    images, labels = jnp.asarray(data.train_images.reshape(-1, 784)), jnp.asarray(data.train_labels)
    order = epoch_permutation(key, 0, 64)
    chunk = create_train_chunk(train_step, config.run.batch_size, max_steps=4)
    state_a, _ = chunk(state_a, images, labels, order, 0, key, num_steps=4)
    for i in range(4):
        idx = order[i * 16:(i + 1) * 16]
        state_b, _ = train_step(state_b, to_batch(images[idx], labels[idx]), key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 state_a.params, state_b.params)


def test_chunk_does_not_recompile_for_new_data_order_offset_or_length():
    """One program serves every chunk length: the short chunk at an epoch's end, or a resume's
    first, costs no compile."""
    config = presets.test()
    key, state, train_step = setup(config)
    data = synthetic_dataset(80)
    images, labels = jnp.asarray(data.train_images.reshape(-1, 784)), jnp.asarray(data.train_labels)
    chunk = create_train_chunk(train_step, config.run.batch_size, max_steps=3)
    state, metrics = chunk(state, images, labels, epoch_permutation(key, 0, 64), 0, key,
                           num_steps=2)
    assert metrics["loss"].shape == (2,)
    compiled = chunk.jitted._cache_size()
    state, metrics = chunk(state, images, labels, epoch_permutation(key, 1, 64), 2, key,
                           num_steps=1)
    assert metrics["loss"].shape == (1,)
    state, metrics = chunk(state, images, labels, epoch_permutation(key, 1, 64), 0, key,
                           num_steps=3)
    assert metrics["loss"].shape == (3,) and np.all(np.isfinite(metrics["loss"]))
    assert chunk.jitted._cache_size() == compiled
    with pytest.raises(ValueError, match="1 to 3 steps"):
        chunk(state, images, labels, epoch_permutation(key, 1, 64), 0, key, num_steps=4)


def test_epoch_order_depends_only_on_seed_and_epoch():
    a = epoch_permutation(run_key(3), 5, 100)
    b = epoch_permutation(run_key(3), 5, 100)
    c = epoch_permutation(run_key(3), 6, 100)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert sorted(np.asarray(a).tolist()) == list(range(100))


@pytest.mark.determinism
def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path):
    config = presets.test().replace(epochs=3, steps_per_call=3)
    data = synthetic_dataset(80)  # 4 steps per epoch: chunks of 3 then 1
    straight = train_and_evaluate(config, data, tmp_path / "straight", callbacks=[Checkpointer()])
    for stop in (2, 5, 9):  # stop mid-chunk boundaries are impossible: max_steps cuts chunks
        run = train_and_evaluate(config.replace(max_steps=stop), data, tmp_path / "resumed",
                                 callbacks=[Checkpointer()])
        assert run.step == stop
    resumed = train_and_evaluate(config, data, tmp_path / "resumed", callbacks=[Checkpointer()])
    assert resumed.step == straight.step == 12
    assert tree_equal(jax.device_get(straight.state.params), jax.device_get(resumed.state.params))
    assert tree_equal(jax.device_get(straight.state.opt_state),
                      jax.device_get(resumed.state.opt_state))


def test_nan_guard_stops_and_names_the_step_and_term(tmp_path):
    class InjectNaN(Callback):
        def on_step_end(self, run, metrics):
            metrics["kl"] = np.where(np.arange(len(metrics["kl"])) == 3, np.nan, metrics["kl"])

    config = presets.test().replace(epochs=2)
    run = train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[InjectNaN(),
                                                                                 NanGuard(),
                                                                       Checkpointer()])
    assert run.exit_code == 3
    assert "non-finite kl" in run.stop_reason and "step 4" in run.stop_reason
    assert not any(p.name.isdigit() for p in tmp_path.iterdir())  # nothing saved after the NaN


def test_callbacks_receive_events_in_order(tmp_path):
    events = []

    class Recorder(Callback):
        def on_fit_start(self, run): events.append("fit_start")
        def on_epoch_start(self, run): events.append("epoch_start")
        def on_step_end(self, run, metrics): events.append("step_end")
        def on_eval_end(self, run, metrics): events.append("eval_end")
        def on_epoch_end(self, run, metrics): events.append("epoch_end")
        def on_fit_end(self, run): events.append("fit_end")

    config = presets.test().replace(epochs=2, steps_per_call=4)
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Recorder()])
    epoch = ["epoch_start", "step_end", "eval_end", "epoch_end"]
    assert events == ["fit_start", *epoch, *epoch, "fit_end"]


def test_extending_a_finished_run_keeps_its_schedule_so_the_rate_does_not_jump(tmp_path, caplog):
    """Raising --epochs on a finished run: the rate stays at the schedule's end, no restart."""
    rates = []

    class Rates(Callback):
        def on_step_end(self, run, metrics):
            rates.extend(float(r) for r in metrics["learning_rate"])

    config = presets.test().replace(epochs=2, lr_schedule="cosine", learning_rate=1e-2,
                                       end_learning_rate=1e-4)
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Rates(), Checkpointer()])
    finished = list(rates)
    assert finished[0] == pytest.approx(1e-2) and finished[-1] < 1e-3  # it had decayed
    rates.clear()
    run = train_and_evaluate(config.replace(epochs=4), synthetic_dataset(80), tmp_path,
                             callbacks=[Rates(), Checkpointer()])
    assert run.step == 16 and len(rates) == 8
    assert max(rates) <= finished[-1]  # no jump back up
    assert rates == pytest.approx([1e-4] * 8)  # the schedule's final rate
    assert "keeps its span of 2 epochs" in caplog.text
    # and so on, if extended again
    assert load_checkpoint(tmp_path).config.optimizer.schedule_epochs == 2


def test_an_explicit_different_schedule_span_on_resume_is_refused(tmp_path):
    config = presets.test().replace(epochs=2, lr_schedule="cosine")
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Checkpointer()])
    with pytest.raises(ResumeError, match="schedule spans 2 epochs"):
        train_and_evaluate(config.replace(epochs=4, schedule_epochs=4), synthetic_dataset(80),
                           tmp_path, callbacks=[Checkpointer()])
