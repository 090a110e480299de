"""The few-labels seam: one object, made from the config, answers what the loop, the step and the
prior fit ask; with few labels the unlabelled images' labels are never read."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae.config import presets
from cvae.data.splits import split_training_set
from cvae.data.synthetic import synthetic_dataset
from cvae.errors import ResumeError
from cvae.model.registry import create_model, init_variables
from cvae.training.devices import create_mesh
from cvae.training.step import create_train_state, device_arrays
from cvae.training.supervision import FewLabels, FullLabels, create_supervision

EVERY = presets.test().replace(validation_size=32)
FEW = EVERY.replace(labels="20", labelled_per_batch=4)


def supervision_of(config, num_train: int = 160):
    data = synthetic_dataset(num_train)
    split = split_training_set(data.train_images, data.train_labels, config)
    return create_supervision(config, split), split


def test_every_label_passes_over_the_training_part_a_batch_a_step():
    supervision, split = supervision_of(EVERY)
    assert isinstance(supervision, FullLabels)
    assert supervision.epoch_rows == len(split.train_labels) == 128
    assert supervision.rows_per_step == EVERY.run.batch_size


def test_few_labels_pass_over_the_unlabelled_images_and_cycle_the_labelled():
    supervision, split = supervision_of(FEW)
    assert isinstance(supervision, FewLabels)
    assert len(supervision.labelled["positions"]) == 20
    assert supervision.epoch_rows == 128 - 20
    assert supervision.rows_per_step == FEW.run.batch_size - FEW.labels.labelled_per_batch
    assert supervision.labelled_share == 20 / 128
    order = supervision.create_epoch_order(jax.random.key(0), create_mesh(jax.devices()[:1]))(0)
    labelled_rows, unlabelled_rows = (np.asarray(rows) for rows in order)
    assert sorted(labelled_rows) == sorted(supervision.labelled["positions"])
    assert sorted(np.concatenate([labelled_rows, unlabelled_rows])) == list(range(128))


def test_the_prior_is_fitted_under_read_labels_never_the_unlabelled_ones_given():
    supervision, split = supervision_of(FEW)
    model = create_model(FEW)
    variables = init_variables(model, jax.random.key(0))
    images, labels = device_arrays(split.train_images, split.train_labels)
    prior_labels = supervision.create_prior_labels(model)
    read, table, mask = prior_labels(variables, images, labels)
    scrambled = jnp.asarray(np.random.default_rng(0).integers(0, 10, len(labels)), jnp.int32)
    again, _, _ = prior_labels(variables, images, scrambled)
    assert np.array_equal(read, again)
    positions = supervision.labelled["positions"]
    assert np.array_equal(np.asarray(read)[positions], supervision.labelled["labels"])
    assert sorted(np.asarray(table)[np.asarray(mask)]) == list(range(len(labels)))


def test_every_label_fits_the_prior_under_the_labels_themselves():
    supervision, split = supervision_of(EVERY)
    images, labels = device_arrays(split.train_images, split.train_labels)
    read, table, mask = supervision.create_prior_labels(create_model(EVERY))({}, images, labels)
    assert read is labels
    for digit in range(10):
        assert set(np.asarray(table[digit])[np.asarray(mask[digit])]) == set(
            np.flatnonzero(split.train_labels == digit))


def test_a_resumed_state_must_carry_the_same_labelled_set(tmp_path):
    supervision, _ = supervision_of(FEW)
    other, _ = supervision_of(FEW.replace(seed=1))
    fresh = create_train_state(create_model(FEW), optax.adam(1e-3), FEW, key=jax.random.key(0))
    adopted = supervision.adopt(fresh, tmp_path)
    assert np.array_equal(adopted.labelled["indices"], supervision.labelled["indices"])
    resumed = other.adopt(fresh, tmp_path).replace(step=jnp.asarray(5, jnp.int32))
    same = supervision.adopt(adopted.replace(step=jnp.asarray(5, jnp.int32)), tmp_path)
    assert np.array_equal(same.labelled["labels"], supervision.labelled["labels"])
    with pytest.raises(ResumeError, match="another labelled set"):
        supervision.adopt(resumed, tmp_path)
