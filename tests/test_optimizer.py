import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae.config import presets
from cvae.model.registry import create_model, init_variables, param_groups
from cvae.training.optimizer import (create_kl_weight_schedule, create_learning_rate_schedule,
                                     create_optimizer, freeze_labels)
from cvae.data.synthetic import synthetic_dataset
from cvae.training.step import create_train_step, ema_decay_at, ema_update, run_key, to_batch
from cvae.training.supervision import FullLabels


def batches(n=4, size=16):
    data = synthetic_dataset(n * size)
    images = jnp.asarray(data.train_images.reshape(-1, 784))
    labels = jnp.asarray(data.train_labels)
    return [to_batch(images[i * size:(i + 1) * size], labels[i * size:(i + 1) * size])
            for i in range(n)]


def train(config, steps=4, total=100):
    """Take `steps` train steps; returns (params before and after each step, state, metrics)."""
    optimizer, schedule = create_optimizer(config, total)
    key = run_key(0)
    state, train_step = create_train_step(create_model(config), optimizer, config, key=key,
                                          supervision=FullLabels(config),
                                          learning_rate_fn=schedule)
    snapshots, history = [jax.device_get(state.params)], []
    for batch in batches(steps):
        state, metrics = train_step(state, batch, key)
        snapshots.append(jax.device_get(state.params))
        history.append(jax.device_get(metrics))
    return snapshots, state, history


def changed(a, b) -> dict[str, bool]:
    return {top: not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a[top]),
                                                                jax.tree.leaves(b[top])))
            for top in a}


# Each optimizer once and each schedule once inside a real step (the schedules' values are
# checked exactly, and cheaply, below).
@pytest.mark.parametrize("optimizer, schedule", [
    ("adam", "constant"), ("adamw", "linear"), ("sgd", "cosine"), ("rmsprop", "warmup_cosine"),
    ("adam", "warmup_linear")])
def test_every_optimizer_and_schedule_takes_a_finite_step(optimizer, schedule):
    config = presets.test().replace(optimizer=optimizer, lr_schedule=schedule, warmup_steps=1,
                                       weight_decay=1e-4, grad_clip_norm=1.0)
    snapshots, _, history = train(config, steps=2)
    assert all(np.isfinite(h["loss"]) for h in history)
    assert any(changed(snapshots[0], snapshots[-1]).values())


@pytest.mark.parametrize("name, checks", [
    ("constant", {0: 1e-3, 50: 1e-3, 100: 1e-3}),
    ("linear", {0: 1e-3, 50: 0.5 * (1e-3 + 1e-5), 100: 1e-5}),
    ("cosine", {0: 1e-3, 50: 1e-5 + 0.5 * (1e-3 - 1e-5), 100: 1e-5}),
    ("warmup_cosine", {0: 0.0, 5: 5e-4, 10: 1e-3, 100: 1e-5}),
    ("warmup_linear", {0: 0.0, 5: 5e-4, 10: 1e-3, 55: 0.5 * (1e-3 + 1e-5), 100: 1e-5}),
])
def test_schedules_give_the_expected_rate_at_chosen_steps(name, checks):
    config = presets.default().replace(lr_schedule=name, learning_rate=1e-3,
                                          end_learning_rate=1e-5, warmup_steps=10)
    schedule = create_learning_rate_schedule(config, total_steps=100)
    for step, expected in checks.items():
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-4, abs=1e-9), step


def test_multisteps_updates_every_k_micro_batches_only():
    snapshots, state, _ = train(presets.test().replace(accumulation_steps=2), steps=4)
    moved = [any(changed(a, b).values()) for a, b in zip(snapshots, snapshots[1:])]
    assert moved == [False, True, False, True]
    assert int(state.step) == 4  # micro-batch steps
    assert int(state.opt_state.gradient_step) == 2  # optimizer updates


def test_frozen_encoder_does_not_change():
    config = presets.test().replace(freeze="encoder")
    snapshots, _, _ = train(config, steps=3)
    moved = changed(snapshots[0], snapshots[-1])
    assert moved == {"encoder": False, "decoder": True}


LADDER = presets.test().replace(model="ladder", stochastic_layers=2, upper_latent_dim=3)


def test_freeze_labels_read_the_familys_param_groups():
    """`--freeze` holds the modules of the family's PARAM_GROUPS entry: a ladder's list modules
    (`upper_0`, `bottom_up_heads_1`) count by their name less the index."""
    params = jax.device_get(init_variables(create_model(LADDER), run_key(0))["params"])
    groups = param_groups(LADDER)
    assert groups == create_model(LADDER).PARAM_GROUPS
    for part, other in (("encoder", "decoder"), ("decoder", "encoder")):
        labels = freeze_labels(params, groups[part])
        for top in params:
            name = re.sub(r"_\d+$", "", top)
            expected = "frozen" if name in groups[part] else "trainable"
            assert {*jax.tree.leaves(labels[top])} == {expected}, (part, top)
            assert not (name in groups[part] and name in groups[other])
    frozen = {top for top in params if {*jax.tree.leaves(freeze_labels(params, groups["encoder"])
                                                         [top])} == {"frozen"}}
    assert {"bottom", "upper_0", "bottom_up_heads_0", "bottom_up_heads_1"} <= frozen
    assert not frozen & {"top_down_nets_0", "top_down_heads_0", "pixels"}
    assert param_groups(presets.test()) == {"encoder": ("encoder",), "decoder": ("decoder",)}


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_a_frozen_ladder_part_does_not_change_and_the_rest_trains(part):
    snapshots, _, history = train(LADDER.replace(freeze=part), steps=2)
    assert all(np.isfinite(h["loss"]) for h in history)
    moved = changed(snapshots[0], snapshots[-1])
    groups = param_groups(LADDER)
    for top, did in moved.items():
        frozen = re.sub(r"_\d+$", "", top) in groups[part]
        assert did != frozen, (top, did)


def test_ema_equals_its_closed_form():
    decay = 0.9
    params, state, _ = train(presets.test().replace(ema_decay=decay), steps=3)
    # ema_0 = p_0, ema_t = d_t ema_(t-1) + (1 - d_t) p_t with the warm-up d_t = (1 + t) / (10 + t)
    # (below 0.9 for t < 80): ema_3 = d3 d2 d1 p0 + d3 d2 (1-d1) p1 + d3 (1-d2) p2 + (1-d3) p3.
    d1, d2, d3 = 2 / 11, 3 / 12, 4 / 13
    expected = jax.tree.map(lambda p0, p1, p2, p3: d3 * d2 * d1 * p0 + d3 * d2 * (1 - d1) * p1
                            + d3 * (1 - d2) * p2 + (1 - d3) * p3, *params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 jax.device_get(state.ema_params), expected)
    np.testing.assert_allclose([ema_decay_at(t, decay) for t in (1, 80, 81, 10_000)],
                               [2 / 11, 0.9, 0.9, 0.9], rtol=1e-6)
    np.testing.assert_allclose(ema_update(jnp.ones(2), jnp.zeros(2), 0.9), [0.9, 0.9])


def test_kl_annealing_rises_linearly_then_holds():
    config = presets.test().replace(kl_schedule="linear", kl_warmup_steps=10, kl_weight=0.5)
    weight = create_kl_weight_schedule(config)
    assert [float(weight(s)) for s in (0, 5, 10, 50)] == pytest.approx([0.0, 0.25, 0.5, 0.5])
    _, _, history = train(config, steps=3)
    assert [float(h["kl_weight"]) for h in history] == pytest.approx([0.0, 0.05, 0.1])


def test_batch_norm_stats_update_in_train_and_not_in_eval():
    config = presets.test().replace(batch_norm=True)
    optimizer, _ = create_optimizer(config, 100)
    key = run_key(0)
    model = create_model(config)
    state, train_step = create_train_step(model, optimizer, config, key=key,
                                          supervision=FullLabels(config))
    before = jax.device_get(state.batch_stats)
    state, _ = train_step(state, batches(1)[0], key)
    after = jax.device_get(state.batch_stats)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                         jax.tree.leaves(after)))
    batch = batches(1)[0]
    noise = jax.random.normal(key, (1, 16, model.noise_dim))
    _, mutated = model.apply(state.eval_variables(), batch["image"], batch["label"], noise,
                             method="terms", train=False, mutable=["batch_stats"])
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(jax.device_get(mutated))):
        np.testing.assert_array_equal(a, b)


def test_dropout_is_on_in_training_and_off_in_evaluation():
    config = presets.test().replace(dropout_rate=0.5)
    model = create_model(config)
    _, state, _ = train(config, steps=1)
    batch = batches(1)[0]
    noise = jax.random.normal(jax.random.key(1), (1, 16, model.noise_dim))

    def apply(train: bool, dropout_seed: int):
        return np.asarray(model.apply(state.eval_variables(), batch["image"], batch["label"],
                                      noise, method="terms", train=train,
                                      rngs={"dropout": jax.random.key(dropout_seed)}).log_px)

    # Evaluation ignores the dropout key it is handed: no unit is dropped.
    np.testing.assert_array_equal(apply(False, 2), apply(False, 3))
    # Training drops different units for different keys, and differs from evaluation.
    assert not np.array_equal(apply(True, 2), apply(True, 3))
    assert not np.array_equal(apply(True, 2), apply(False, 2))


def test_gradient_clipping_bounds_the_update_to_the_clip_norm():
    # Plain SGD (no momentum, constant rate 0.5): the update is -0.5 x the clipped gradient.
    config = presets.test().replace(optimizer="sgd", momentum=0.0, learning_rate=0.5,
                                       end_learning_rate=0.5, grad_clip_norm=0.01)
    snapshots, _, history = train(config, steps=1)
    step = optax.tree.norm(jax.tree.map(np.subtract, snapshots[1], snapshots[0]))
    assert float(history[0]["grad_norm"]) > 1.0  # the raw gradient is far above the clip norm
    assert float(step) == pytest.approx(0.5 * 0.01, rel=1e-4)
    # Without clipping the same step moves by the raw gradient's norm.
    snapshots, _, history = train(config.replace(grad_clip_norm=0.0), steps=1)
    step = optax.tree.norm(jax.tree.map(np.subtract, snapshots[1], snapshots[0]))
    assert float(step) == pytest.approx(0.5 * float(history[0]["grad_norm"]), rel=1e-4)
