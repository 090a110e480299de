"""How many labels a run trains with: one object that the loop, the step and the validation ask.

`create_supervision(config, split)` makes it once per run:
- `FullLabels`: every training image keeps its label (`--labels all`, the conditional VAE);
- `FewLabels`: `--labels N`, Kingma et al.'s M2 (`cvae.training.few_labels` has its maths): N
  labelled images, the rest trained without their labels, and a classifier q(y|x).

Both answer the same questions, so no other module asks which mode a run is in:
- `epoch_rows`, `rows_per_step`: the rows one epoch passes over, and how many each step takes;
- `check_devices(mesh)`: whether the batches split evenly over the devices;
- `adopt(state, checkpoint_dir)`: the state carrying the run's labelled set;
- `create_epoch_order(key, mesh)`: `order(epoch)`, the rows of that epoch's batches;
- `create_train_chunk(train_step, mesh)`: the fused steps that read batches in that order;
- `loss(...)`: one batch's objective, called inside the jitted step;
- `create_validation_figures(model)`: the validation figures beyond the objective's terms;
- `create_prior_labels(model)`: the labels the mixture prior is fitted under.
The objects hold Python values and host arrays only, and what they build are pure functions of
arrays: the jitted step stays pure. Below training, the model itself says whether it has a
classifier (`Family.has_classifier`), which is all the sampler and `cvae eval` need to know.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from cvae.config.sections import Config
from cvae.data.splits import TrainValidation
from cvae.errors import ConfigError
from cvae.model import objectives
from cvae.model import prior as prior_lib
from cvae.training import few_labels
from cvae.training.devices import replicate
from cvae.training.step import (StepKeys, create_train_chunk, epoch_permutation,
                                labelled_permutation)


class Supervision(Protocol):
    """What the loop, the step and the validation ask (module docstring)."""

    epoch_rows: int
    rows_per_step: int

    def check_devices(self, mesh) -> None: ...
    def adopt(self, state, checkpoint_dir: Path): ...
    def create_epoch_order(self, key: jax.Array, mesh) -> Callable: ...
    def create_train_chunk(self, train_step: Callable, mesh) -> Callable: ...
    def loss(self, model, variables: dict, *, images, labels, keys: StepKeys, kl_weight,
             mutable: list[str]): ...
    def create_validation_figures(self, model) -> Callable: ...
    def create_prior_labels(self, model) -> Callable: ...


@dataclasses.dataclass(frozen=True)
class FullLabels:
    """Every training image keeps its label: one permutation of the training part per epoch,
    and the conditional VAE's negative ELBO."""

    config: Config
    # The training part's labels, i32[N] (for the loop; a step alone does not need them).
    train_labels: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def epoch_rows(self) -> int:
        return len(self.train_labels)

    @property
    def rows_per_step(self) -> int:
        return self.config.run.batch_size

    def check_devices(self, mesh) -> None:
        """Nothing beyond the batch itself (`cvae.training.devices.check_divisible`)."""

    def adopt(self, state, checkpoint_dir: Path):
        return state

    def create_epoch_order(self, key: jax.Array, mesh) -> Callable:
        return lambda epoch: replicate(epoch_permutation(key, epoch, self.epoch_rows), mesh)

    def create_train_chunk(self, train_step: Callable, mesh) -> Callable:
        return create_train_chunk(train_step, self.config.run.batch_size, mesh,
                                  max_steps=self.config.run.steps_per_call)

    def loss(self, model, variables: dict, *, images, labels, keys: StepKeys, kl_weight,
             mutable: list[str]):
        """-> (loss, (terms, updates)): the batch's mean negative bound (the config's
        objective), its noise drawn from the step's key."""
        cfg = self.config
        noise = objectives.draw_noise(keys.z, model, samples=cfg.objective.importance_samples,
                                      batch=images.shape[0])
        rows, _, updates = objectives.row_terms(
            model, variables, images=images, labels=labels, noise=noise,
            objective=cfg.objective.bound, kl_weight=kl_weight, train=True,
            rngs={"dropout": keys.dropout}, mutable=mutable)
        loss, terms = objectives.batch_loss(rows, objective=cfg.objective.bound,
                                            kl_weight=kl_weight,
                                            free_bits=cfg.objective.free_bits)
        return loss, (terms, updates)

    def create_validation_figures(self, model) -> Callable:
        return lambda variables, images_u8, labels: {}

    def create_prior_labels(self, model) -> Callable:
        """Every image's own label, and the class table built from them once."""
        table = prior_lib.class_index_table(self.train_labels, model.num_classes)
        return lambda variables, images_u8, labels: (labels, *table)


@dataclasses.dataclass(frozen=True)
class FewLabels:
    """`--labels N`: each batch is `labelled_per_batch` labelled images (cycled) followed by
    unlabelled ones (one permutation per epoch), and the loss is M2's."""

    config: Config
    # {"positions": rows of the training part, "indices": rows of the training file,
    # "labels"}, all i32[N] (`cvae.training.few_labels.choose_labelled_set`).
    labelled: dict[str, np.ndarray]
    num_training: int  # images in the training part, labelled or not

    @property
    def epoch_rows(self) -> int:
        """An epoch is one pass over the unlabelled images; the labelled ones cycle."""
        return self.num_training - len(self.labelled["positions"])

    @property
    def rows_per_step(self) -> int:
        return self.config.run.batch_size - self.config.labels.labelled_per_batch

    @property
    def labelled_share(self) -> float:
        """N_l / N: the labelled images' share of the training images."""
        return self.config.labels.labelled_count / self.num_training

    def check_devices(self, mesh) -> None:
        if self.config.labels.labelled_per_batch % mesh.size:
            raise ConfigError(
                f"labelled_per_batch={self.config.labels.labelled_per_batch}: must be a "
                f"multiple of the {mesh.size} devices used for data parallelism")

    def adopt(self, state, checkpoint_dir: Path):
        """`state` carrying the run's labelled set; a resumed state must carry the same one."""
        if int(state.step) > 0:
            few_labels.check_labelled_set(jax.device_get(state.labelled), self.labelled,
                                          checkpoint_dir)
        return state.replace(labelled={name: jnp.asarray(self.labelled[name])
                                       for name in ("indices", "labels")})

    def create_epoch_order(self, key: jax.Array, mesh) -> Callable:
        """`order(epoch)` -> (labelled rows, unlabelled rows), each permuted for that epoch."""
        labelled_rows = jnp.asarray(self.labelled["positions"])
        unlabelled_rows = jnp.asarray(
            few_labels.unlabelled_positions(self.num_training, self.labelled["positions"]))

        def order(epoch):
            return replicate(
                (labelled_rows[labelled_permutation(key, epoch, labelled_rows.shape[0])],
                 unlabelled_rows[epoch_permutation(key, epoch, unlabelled_rows.shape[0])]),
                mesh)

        return order

    def create_train_chunk(self, train_step: Callable, mesh) -> Callable:
        return few_labels.create_semi_train_chunk(train_step, self.config)

    def loss(self, model, variables: dict, *, images, labels, keys: StepKeys, kl_weight,
             mutable: list[str]):
        """-> (loss, (terms, updates)): M2's objective per training image; the batch's first
        `len(labels)` images are the labelled ones."""
        n_l = labels.shape[0]
        outputs, updates = few_labels.per_label_terms(
            model, variables, x_labelled=images[:n_l], y_labelled=labels,
            x_unlabelled=images[n_l:], z_key=keys.z, kl_weight=kl_weight, train=True,
            rngs={"dropout": keys.dropout}, mutable=mutable, config=self.config,
            shift_key=keys.shift)
        loss, terms = few_labels.semi_supervised_loss(
            outputs, config=self.config, kl_weight=kl_weight,
            labelled_share=self.labelled_share, y_labelled=labels)
        if self.config.labels.vat_weight > 0:
            # On the plain images, labelled and not, through the classifier as it reads at
            # inference (no dropout, BatchNorm's running statistics): the function /classify
            # serves is the one made smooth, and its two readings differ by the offset alone.
            vat = few_labels.virtual_adversarial_loss(
                lambda x: model.apply(variables, x, method="classify"), images,
                keys.vat, epsilon=self.config.labels.vat_epsilon)
            loss = loss + self.config.labels.vat_weight * vat
            terms = {**terms, "loss": loss, "virtual_adversarial": vat}
        return loss, (terms, updates)

    def create_validation_figures(self, model) -> Callable:
        """q(y|x)'s error rate on the validation images, as "classifier_error"."""
        error = few_labels.create_error_fn(model)
        return lambda variables, images_u8, labels: {
            "classifier_error": error(variables, images_u8, labels)}

    def create_prior_labels(self, model) -> Callable:
        """The unlabelled images' labels are never read: each gets the label q(y|x) reads, the
        labelled ones keep their own."""
        read_labels = few_labels.create_read_labels_fn(model)
        positions = jnp.asarray(self.labelled["positions"])
        known = jnp.asarray(self.labelled["labels"])

        def prior_labels(variables, images_u8, labels):
            read = read_labels(variables, images_u8).astype(jnp.int32).at[positions].set(known)
            # Widths rounded up, so the fit compiles for a few table shapes, not one per epoch.
            table = prior_lib.class_index_table(jax.device_get(read), model.num_classes,
                                                width_multiple=1024)
            return (read, *table)

        return prior_labels


def create_supervision(config: Config, split: TrainValidation) -> FullLabels | FewLabels:
    """The run's supervision, from its `--labels` and its training part."""
    if config.labels.labelled_count is None:
        return FullLabels(config, split.train_labels)
    return FewLabels(config, few_labels.choose_labelled_set(split, config),
                     len(split.train_labels))
