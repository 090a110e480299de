"""Semi-supervised training (`--labels N`, Kingma et al. 2014 M2): the labelled set, the loss,
the batches, and that `--labels all` is the conditional VAE it always was."""

from __future__ import annotations

import dataclasses
import functools
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_reliability import kill_repeatedly, train_command
from trees import tree_equal

from cvae.config import presets
from cvae.training import few_labels
from cvae.training.callbacks import Checkpointer, NanGuard
from cvae.training.checkpoints import load_checkpoint
from cvae.config.sections import ConfigError
from cvae.data.specs import check_config
from cvae.data.specs import MNIST
from cvae.errors import ResumeError
from cvae.training.loop import train_and_evaluate
from cvae.model import densities, objectives
from cvae.model.objectives import RowTerms
from cvae.model.registry import create_model, init_variables
from cvae.data.splits import _LABELLED_SALT, _hash_keys, labelled_indices, split_training_set
from cvae.data.synthetic import synthetic_dataset
from cvae.training.step import create_train_state

CLASSES = MNIST.num_classes

SEMI = presets.test().replace(labels="20", labelled_per_batch=4, validation_size=32)
# The fitted mixture as the test preset had it before the config was nested (its defaults are
# 30 components fitted to posterior draws now).
MIXTURE = {"prior": "mixture", "prior_components": 10, "prior_codes": "means"}


def test_labelled_set_is_class_balanced_deterministic_and_disjoint_from_validation():
    data = synthetic_dataset(400)
    config = SEMI.replace(dataset="fashion_mnist", validation_size=64, labels="50")
    split = split_training_set(data.train_images, data.train_labels, config)
    chosen = few_labels.choose_labelled_set(split, config)
    assert np.bincount(chosen["labels"], minlength=CLASSES).tolist() == [5] * CLASSES
    assert np.array_equal(chosen["labels"], data.train_labels[chosen["indices"]])
    held_out = set(range(400)) - set(split.train_indices.tolist())
    assert len(held_out) == 64 and not held_out & set(chosen["indices"].tolist())
    again = few_labels.choose_labelled_set(split_training_set(data.train_images, data.train_labels,
                                                              config), config)
    assert all(np.array_equal(chosen[k], again[k]) for k in chosen)
    other_seed = few_labels.choose_labelled_set(split_training_set(
        data.train_images, data.train_labels, config.replace(seed=1)), config.replace(seed=1))
    assert not np.array_equal(chosen["indices"], other_seed["indices"])


def test_labelled_choice_depends_on_file_index_not_on_position():
    """The same file rows are chosen whatever else is in the training part (a class's pick is
    the lowest hashes of its file indices)."""
    labels = np.repeat(np.arange(CLASSES), 6)
    rows = np.arange(60) * 3 + 7
    full = rows[labelled_indices(labels, rows, count=20, num_classes=CLASSES, seed=5)]
    keep = np.ones(60, bool)
    keep[::7] = False  # drop some rows that were not chosen ...
    keep[np.searchsorted(rows, full)] = True  # ... but none that were
    part = rows[keep][labelled_indices(labels[keep], rows[keep], count=20, num_classes=CLASSES,
                                       seed=5)]
    assert np.array_equal(full, part)


def test_too_many_labels_for_a_class_names_the_field():
    with pytest.raises(ConfigError, match="labels=70: class"):
        labelled_indices(np.repeat(np.arange(CLASSES), 6), np.arange(60), count=70,
                         num_classes=CLASSES, seed=0)


@pytest.mark.parametrize("changes, field", [
    ({"labels": "15"}, "labels"), ({"labels": "x"}, "labels"), ({"labels": "0"}, "labels"),
    ({"labelled_per_batch": 16}, "labelled_per_batch"),
    ({"classifier_weight": -1.0}, "classifier_weight"),
    ({"entropy_weight": -0.5}, "entropy_weight"), ({"vat_weight": -1.0}, "vat_weight"),
    ({"vat_epsilon": 0.0}, "vat_epsilon")])
def test_bad_semi_supervised_config_names_the_field(changes, field):
    """The setting by its path (`labels.vat_weight`) or, for the labelled count, its flag's
    name; a count that is no multiple of the classes is the dataset's check."""
    with pytest.raises(ConfigError, match=rf"^(labels\.)?{field}="):
        check_config(SEMI.replace(**changes).validate())


def test_every_label_model_has_no_classifier_and_few_label_model_has_one():
    key = jax.random.key(0)
    plain = init_variables(create_model(presets.test()), key)["params"]
    few = init_variables(create_model(SEMI), key)["params"]
    assert "classifier" not in plain and set(few) == set(plain) | {"classifier"}
    # The VAE's own parameters are initialised the same either way.
    assert tree_equal({k: few[k] for k in plain}, plain)


@functools.partial(jax.jit, static_argnames=("model", "kl_weight", "config"))
def label_terms(model, variables, x_labelled, y_labelled, x_unlabelled, z_key, kl_weight,
                shift_key=None, config=SEMI):
    """`few_labels.per_label_terms`' outputs in evaluation mode, jitted (eager, each op compiled
    on its own); their n_l and rows' rest_dims come back as arrays."""
    outputs, _ = few_labels.per_label_terms(
        model, variables, x_labelled=x_labelled, y_labelled=y_labelled,
        x_unlabelled=x_unlabelled, z_key=z_key, kl_weight=kl_weight, train=False, rngs={},
        mutable=[], config=config, shift_key=shift_key)
    return outputs


@functools.partial(jax.jit, static_argnames=("n_l", "rest_dims", "config", "kl_weight",
                                             "labelled_share"))
def jitted_semi_loss(logits, rows, second, y_labelled, n_l, rest_dims, config, kl_weight,
                     labelled_share):
    return few_labels.semi_supervised_loss(
        (logits, rows._replace(rest_dims=rest_dims), n_l, second), config=config,
        kl_weight=kl_weight, labelled_share=labelled_share, y_labelled=y_labelled)


def semi_loss(outputs, *, config, kl_weight, labelled_share, y_labelled):
    """`few_labels.semi_supervised_loss`, jitted (eager, each op compiled on its own), n_l and
    rest_dims static as in the train step."""
    logits, rows, n_l, second = outputs
    return jitted_semi_loss(logits, rows._replace(rest_dims=None), second, y_labelled,
                            int(n_l), int(rows.rest_dims), config, kl_weight, labelled_share)


def test_unlabelled_loss_is_the_explicit_sum_over_the_ten_labels():
    config = SEMI.replace(kl_weight=2.0, classifier_weight=0.5)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(3))
    data = synthetic_dataset(8)
    x = jnp.asarray(data.train_images.reshape(8, -1) / 255.0, jnp.float32)
    y = jnp.asarray(data.train_labels[:3], jnp.int32)
    z_key = jax.random.key(7)
    outputs = label_terms(model, variables, x[:3], y, x[3:], z_key, 2.0)
    loss, terms = semi_loss(outputs, config=config, kl_weight=2.0, labelled_share=0.25,
                            y_labelled=y)

    # By hand: each unlabelled image with each label on its own, with the noise of its row
    # (labelled rows first, then image i with label k at 3 + 10 i + k).
    noise = jax.random.normal(z_key, (3 + 5 * CLASSES, config.model.options.latent_dim))

    @jax.jit  # eager, each op compiled on its own (53 calls)
    def jitted_neg_elbo(variables, image, label, noise_row):
        mean, logvar = model.apply(variables, image[None], jnp.array([label]), method="encode")
        z = mean + jnp.exp(0.5 * logvar) * noise_row
        logits = model.apply(variables, z, jnp.array([label]), method="decode")
        return (densities.reconstruction(logits, image[None], config.likelihood.name)[0]
                + 2.0 * densities.kl_per_dimension(mean, logvar).sum())

    def neg_elbo(image, label, row):
        return float(jitted_neg_elbo(variables, image, label, noise[row]))

    classify = jax.jit(functools.partial(model.apply, method="classify"))
    unlabelled = []
    for i in range(5):
        logits = classify(variables, x[3 + i][None])[0]
        q = np.asarray(jax.nn.softmax(logits), np.float64)
        per_label = [neg_elbo(x[3 + i], k, 3 + CLASSES * i + k) for k in range(CLASSES)]
        unlabelled.append(np.sum(q * per_label) + np.sum(q * np.log(q)))
    labelled = [neg_elbo(x[j], int(y[j]), j) for j in range(3)]
    class_logits = classify(variables, x[:3])
    cross_entropy = -np.mean(np.asarray(jax.nn.log_softmax(class_logits))[np.arange(3), y])
    assert float(terms["unlabelled_loss"]) == pytest.approx(np.mean(unlabelled), rel=1e-5)
    assert float(terms["labelled_loss"]) == pytest.approx(np.mean(labelled), rel=1e-5)
    assert float(loss) == pytest.approx(
        0.25 * np.mean(labelled) + 0.75 * np.mean(unlabelled) + 0.5 * cross_entropy, rel=1e-5)


def params_after(config, directory, data=None):
    run = train_and_evaluate(config, data or synthetic_dataset(80), directory)
    return run.state.params


def test_labels_all_trains_the_same_parameters_bit_for_bit(tmp_path):
    """The semi-supervised settings cannot reach a run with every label: changing them leaves the
    parameters bit-identical, and the state carries no labelled set."""
    config = presets.test().replace(epochs=2, **MIXTURE)
    reference = params_after(config, tmp_path / "a")
    changed = config.replace(labels="all", classifier_weight=7.0, labelled_per_batch=3)
    assert tree_equal(params_after(changed, tmp_path / "b"), reference)
    assert "classifier" not in reference
    state = create_train_state(create_model(config), optax.adam(1e-3), config,
                               key=jax.random.key(0))
    assert state.labelled == {}


class Untouchable:
    def __len__(self):
        raise AssertionError("training touched the test set (len)")

    def __getitem__(self, index):
        raise AssertionError("training touched the test set (indexing)")


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_semi_supervised_run_records_its_labelled_set_and_resumes_exactly(tmp_path):
    """With the classifier's levers on (virtual adversarial training, entropy minimisation),
    whose random directions come from the step's key like every other draw. The test set is
    one that fails when touched: semi-supervised training (its mixture prior's fit, its
    validation of q(y|x) included) never reads it."""
    data = dataclasses.replace(synthetic_dataset(200), test_images=Untouchable(),
                               test_labels=Untouchable())
    config = SEMI.replace(epochs=3, **MIXTURE, vat_weight=1.0, entropy_weight=0.5)
    whole = train_and_evaluate(config, data, tmp_path / "whole",
                               callbacks=[NanGuard(), Checkpointer()])
    # 168 training images, 20 labelled: 148 unlabelled, 12 a step -> 12 steps an epoch.
    assert whole.step == 36 and whole.stop_reason is None
    saved = load_checkpoint(tmp_path / "whole")
    split = split_training_set(data.train_images, data.train_labels, config)
    chosen = few_labels.choose_labelled_set(split, config)
    assert np.array_equal(saved.state.labelled["indices"], chosen["indices"])
    assert np.array_equal(saved.state.labelled["labels"], chosen["labels"])
    assert "validation_classifier_error" in saved.metrics

    train_and_evaluate(config.replace(max_steps=17), data, tmp_path / "parts",
                       callbacks=[Checkpointer()])
    resumed = train_and_evaluate(config, data, tmp_path / "parts", callbacks=[Checkpointer()])
    assert resumed.start_step == 17 and resumed.step == 36
    assert tree_equal(resumed.state.params, whole.state.params)
    assert tree_equal(resumed.state.prior, whole.state.prior)


def test_resume_refuses_a_changed_labelled_set(tmp_path):
    data = synthetic_dataset(200)
    config = SEMI.replace(epochs=1)
    train_and_evaluate(config, data, tmp_path, callbacks=[Checkpointer()])
    relabelled = dataclasses.replace(data, train_labels=np.roll(data.train_labels, 1))
    with pytest.raises(ResumeError, match="another labelled set"):
        train_and_evaluate(config.replace(epochs=2), relabelled, tmp_path,
                           callbacks=[Checkpointer()])


def test_unlabelled_images_labels_are_never_read(tmp_path):
    """Relabelling unlabelled images changes nothing, bit for bit (the mixture prior's fit reads
    q(y|x) for them). Their labels only choose the labelled set (class balance needs them), so
    each moves to a class where it still would not be chosen."""
    data = synthetic_dataset(200)
    config = SEMI.replace(epochs=2, **MIXTURE)
    split = split_training_set(data.train_images, data.train_labels, config)
    chosen = few_labels.choose_labelled_set(split, config)
    hashes = _hash_keys(config.run.seed, np.arange(200), _LABELLED_SALT)
    highest_chosen = [hashes[chosen["indices"][chosen["labels"] == c]].max()
                      for c in range(CLASSES)]
    relabelled = data.train_labels.copy()
    for row in np.setdiff1d(split.train_indices, chosen["indices"]):
        relabelled[row] = next((c for c in range(CLASSES) if c != relabelled[row]
                                and hashes[row] > highest_chosen[c]), relabelled[row])
    assert np.mean(relabelled != data.train_labels) > 0.5
    moved = dataclasses.replace(data, train_labels=relabelled)
    again = few_labels.choose_labelled_set(
        split_training_set(moved.train_images, relabelled, config), config)
    assert np.array_equal(again["indices"], chosen["indices"])
    a = train_and_evaluate(config, data, tmp_path / "a")
    b = train_and_evaluate(config, moved, tmp_path / "b")
    assert tree_equal(a.state.params, b.state.params)
    assert tree_equal(a.state.prior, b.state.prior)


# 256 training images, 100 labelled: 156 unlabelled, 12 a step -> 13 steps an epoch; 3 epochs,
# 39 steps in all: a save to kill after and to resume from, and another to kill inside.
FEW_LABELS = ("--labels", "100", "--labelled-per-batch", "4", "--classifier-weight", "1",
              "--epochs", "3")


@pytest.mark.slow  # several processes, one killed: `make test-slow`
def test_sigkill_with_100_labels_then_resume_gives_identical_parameters(data_dir, tmp_path):
    def finish(directory):
        result = subprocess.run(train_command(data_dir, directory, *FEW_LABELS),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return load_checkpoint(directory)

    reference = finish(tmp_path / "reference")
    kills = kill_repeatedly(train_command(data_dir, tmp_path / "killed", *FEW_LABELS),
                            tmp_path / "killed", seed=21, max_kills=3)
    assert kills >= 3, "the run finished before it could be killed enough times"
    final = finish(tmp_path / "killed")
    assert final.step == reference.step == 39
    assert tree_equal(final.state.params, reference.state.params)
    assert tree_equal(final.state.opt_state, reference.state.opt_state)
    assert tree_equal(final.state.labelled, reference.state.labelled)
    assert len(final.state.labelled["indices"]) == 100


def test_shift_moves_each_image_by_at_most_the_bound_and_zero_is_identity():
    image = np.zeros((28, 28), np.float32)
    image[10:14, 12:15] = 1.0
    images = jnp.asarray(np.stack([image.reshape(-1)] * 64))
    still = few_labels.shift_images(jax.random.key(0), images, 0, image_shape=(28, 28))
    assert np.array_equal(still, images)
    moved = np.asarray(few_labels.shift_images(jax.random.key(0), images, 2,
                                               image_shape=(28, 28))).reshape(64, 28, 28)
    rows, cols = np.nonzero(moved.sum(axis=2))[1], np.nonzero(moved.sum(axis=1))[1]
    assert rows.min() >= 8 and rows.max() <= 15 and cols.min() >= 10 and cols.max() <= 16
    assert np.all(moved.sum(axis=(1, 2)) == image.sum())  # nothing lost off the edge
    assert len({m.tobytes() for m in moved}) > 10


def test_consistency_term_is_zero_without_shifts_and_counts_with_them():
    config = SEMI.replace(classifier_shift=2, consistency_weight=3.0, classifier_weight=0.5)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(3))
    x = jnp.asarray(synthetic_dataset(8).train_images.reshape(8, -1) / 255.0, jnp.float32)
    y = jnp.zeros((3,), jnp.int32)
    plain = label_terms(model, variables, x[:3], y, x[3:], jax.random.key(1), 1.0)
    assert plain[3] is None
    shifted = label_terms(model, variables, x[:3], y, x[3:], jax.random.key(1), 1.0,
                          shift_key=jax.random.key(2), config=config)
    assert shifted[0].shape == (8, CLASSES) and shifted[3].shape == (5, CLASSES)
    base, terms = semi_loss(shifted, config=config.replace(consistency_weight=0.0),
                            kl_weight=1.0, labelled_share=0.1, y_labelled=y)
    with_consistency, _ = semi_loss(shifted, config=config, kl_weight=1.0, labelled_share=0.1,
                                    y_labelled=y)
    assert float(terms["consistency"]) > 0
    # float32 losses of a few hundred nats: their difference is good to about 1e-4
    assert float(with_consistency - base) == pytest.approx(3.0 * float(terms["consistency"]),
                                                           abs=5e-4)


@functools.partial(jax.jit, static_argnames="kl_weight")
def elbo_rows(rec, kl_per_dim, kl_weight=1.0) -> RowTerms:
    """The ELBO's rows from per-row reconstructions f32[R] and KLs per dimension f32[R, D]
    (each dimension's KL in closed form, as the one-latent family's); jitted (eager, each op
    compiled on its own), so its rest_dims comes back as an array."""
    kl = kl_per_dim.sum(-1)
    return RowTerms(rec + kl_weight * kl, rec, kl, kl_per_dim, jnp.zeros_like(rec), -(rec + kl),
                    0)


def test_entropy_weight_adds_the_unlabelled_readings_mean_entropy():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(5, CLASSES)), jnp.float32)  # 2 labelled, 3 not
    rec = jnp.asarray(rng.random(2 + 3 * CLASSES) * 100, jnp.float32)
    kl_per_dim = jnp.asarray(rng.random((2 + 3 * CLASSES, 3)), jnp.float32)
    outputs, y = (logits, elbo_rows(rec, kl_per_dim), 2, None), jnp.zeros((2,), jnp.int32)
    config = SEMI.replace(classifier_weight=0.5)
    base, terms = semi_loss(outputs, config=config, kl_weight=1.0, labelled_share=0.1,
                            y_labelled=y)
    minimised, _ = semi_loss(outputs, config=config.replace(entropy_weight=2.0), kl_weight=1.0,
                             labelled_share=0.1, y_labelled=y)
    q = jax.nn.softmax(logits[2:])
    entropy = float(-jnp.sum(q * jnp.log(q), axis=-1).mean())
    assert float(terms["entropy"]) == pytest.approx(entropy, rel=1e-5)
    assert float(minimised - base) == pytest.approx(2.0 * entropy, abs=5e-4)


def linear_classifier(seed: int):
    weights = jnp.asarray(np.random.default_rng(seed).normal(size=(784, CLASSES)) * 0.1,
                          jnp.float32)
    return lambda images: images @ weights


# few_labels.virtual_adversarial_loss jitted, as the train step runs it (eager, each op compiled
# on its own)
vat_loss = jax.jit(few_labels.virtual_adversarial_loss, static_argnums=0,
                   static_argnames="epsilon")


def test_virtual_adversarial_offset_changes_the_reading_more_than_random_ones():
    """The power iteration finds a worse direction than chance: at the same length, the
    divergence it reports exceeds that of every one of 50 random offsets."""
    classify = linear_classifier(0)
    images = jnp.asarray(np.random.default_rng(1).random((6, 784)), jnp.float32)
    adversarial = vat_loss(classify, images, jax.random.key(2), epsilon=1.0)
    clean = jax.nn.log_softmax(classify(images))

    @jax.jit  # eager, each op compiled on its own (50 calls)
    def jitted_divergence(clean, offset):
        moved = jax.nn.log_softmax(classify(images + offset))
        return jnp.sum(jnp.exp(clean) * (clean - moved), axis=-1).mean()

    def divergence(offset):
        return float(jitted_divergence(clean, offset))

    random = [divergence(few_labels._unit_rows(jax.random.normal(jax.random.key(k), (6, 784))))
              for k in range(50)]
    assert float(adversarial) > 2 * max(random) > 0


def test_virtual_adversarial_loss_is_zero_for_a_reading_that_ignores_the_image():
    def constant(images):
        return jnp.zeros((images.shape[0], CLASSES)) + jnp.arange(10.0)

    images = jnp.ones((3, 784), jnp.float32)
    assert float(vat_loss(constant, images, jax.random.key(0), epsilon=0.3)) == 0.0


def test_free_bits_floor_each_dimensions_weighted_mean_kl():
    """With labelled_share 1 the unlabelled rows weigh nothing, and the floor acts on the
    labelled rows' mean KL per dimension exactly as it does on a batch's mean
    (`objectives.counted_kl`)."""
    rng = np.random.default_rng(0)
    rec = jnp.asarray(rng.random(4 + CLASSES) * 100, jnp.float32)  # 4 labelled, 1 not
    kl_per_dim = jnp.asarray(rng.random((4 + CLASSES, 3)) * 0.4, jnp.float32)
    outputs = (jnp.zeros((5, CLASSES)), elbo_rows(rec, kl_per_dim, 2.0), 4, None)
    y = jnp.zeros((4,), jnp.int32)
    config = SEMI.replace(classifier_weight=0.0)
    loss, _ = semi_loss(outputs, config=config.replace(free_bits=0.3), kl_weight=2.0,
                        labelled_share=1.0, y_labelled=y)
    labelled = kl_per_dim[:4]
    expected = rec[:4].mean() + 2.0 * objectives.counted_kl(
        labelled.sum(-1).mean(), labelled.mean(0), 0.0, rest_dims=0, free_bits=0.3)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    by_hand = float(rec[:4].mean()) + 2.0 * float(np.maximum(np.asarray(labelled).mean(0),
                                                             0.3).sum())
    assert float(loss) == pytest.approx(by_hand, rel=1e-6)
    plain, _ = semi_loss(outputs, config=config, kl_weight=2.0, labelled_share=1.0,
                         y_labelled=y)
    assert float(loss) > float(plain)


@pytest.mark.slow  # a 4-device subprocess: `make test-slow`
def test_four_device_semi_supervised_training_matches_one_device(four_device_runs):
    """With the classifier's levers on (a mixture prior, virtual adversarial training and
    entropy minimisation): tests/four_devices.py's `semi` case."""
    out = four_device_runs["semi"]
    (loss_one, vat_one), (loss_four, vat_four) = (
        (out[count]["loss"], out[count]["virtual_adversarial"]) for count in ("one", "four"))
    assert len(loss_one) == len(loss_four) == len(vat_four) == 12
    assert min(vat_one) > 0  # the virtual adversarial term is on, and counted in the loss
    for single, parallel in zip(loss_one + vat_one, loss_four + vat_four):
        assert abs(single - parallel) <= 1e-3 * abs(single), (out["one"], out["four"])
