"""Semi-supervised training (Kingma et al. 2014, model M2): the loss and the batches.

With `--labels N` a few training images keep their labels; for the rest the label is a latent
variable with its own encoder, the classifier q(y|x). Per image (nats):

- labelled (x, y):  L(x, y) = -ELBO(x, y) = reconstruction + kl_weight * KL(q(z|x,y) || N(0, I));
- unlabelled x:     U(x) = sum_y q(y|x) L(x, y) - H(q(y|x)), every label in one batched pass
                    (each x repeated with every label: one encoder and one decoder call);
- classifier:       CE(x, y) = -log q(y|x) on the labelled images.

The paper's objective is J^alpha = sum_labelled L + sum_unlabelled U + alpha * E_labelled[CE] with
alpha = 0.1 * N over the N training images. Divided by N it is an average per training image:
(N_l / N) mean_l L + (N_u / N) mean_u U + 0.1 mean_l CE, which is what `semi_supervised_loss`
computes from a batch (`labelled_share` = N_l / N, `classifier_weight` = 0.1 by default). The
batch's own mix of labelled and unlabelled images (`labelled_per_batch`) therefore changes only
the noise of the estimate, not what is minimised. (-log p(y) = log C, C classes, is a constant
and left out.)

Each batch is `labelled_per_batch` labelled images followed by the rest unlabelled: the unlabelled
ones run through one permutation per epoch, the labelled ones through their own permutation per
epoch, cycled, so even 100 labels fill every batch's labelled share.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cvae.config.sections import Config
from cvae.data.pixels import to_unit
from cvae.data.specs import spec_of
from cvae.errors import ResumeError
from cvae.model import objectives
from cvae.data.splits import labelled_indices
from cvae.training.step import first_rows, fused_steps


def shift_images(key: jax.Array, images: jax.Array, max_shift: int, *,
                 image_shape: tuple[int, ...]) -> jax.Array:
    """Each image f32[B, P] moved by its own random (dy, dx) in [-max_shift, max_shift]^2
    (rolled: a digit's border is blank, so a roll of a few pixels is a shift)."""
    shifts = jax.random.randint(key, (images.shape[0], 2), -max_shift, max_shift + 1)

    def one(image, shift):
        return jnp.roll(image.reshape(image_shape), shift, axis=(0, 1)).reshape(-1)

    return jax.vmap(one)(images, shifts)


def per_label_terms(model, variables: dict, *, x_labelled, y_labelled, x_unlabelled, z_key,
                    kl_weight, train: bool, rngs: dict, mutable, config: Config,
                    shift_key: jax.Array | None = None):
    """One pass of the model over the labelled rows and every unlabelled row with each label,
    under the run's objective (cvae/model/objectives.py), and q(y|x) reading them.

    -> ((class logits f32[n_l + n_u, C], `RowTerms` of R rows, n_l, second logits f32[n_u, C]
    or None), updates), R = n_l + C n_u rows: the labelled rows, then unlabelled image i with
    label y at n_l + C i + y. With `classifier_shift` (and `shift_key`) q(y|x) reads randomly
    shifted images; with `consistency_weight` it also reads a second shift of each unlabelled
    image (the "second logits").
    """
    classes = model.num_classes
    n_l, n_u = x_labelled.shape[0], x_unlabelled.shape[0]
    targets = jnp.concatenate([x_labelled, jnp.repeat(x_unlabelled, classes, axis=0)])
    labels = jnp.concatenate([y_labelled, jnp.tile(jnp.arange(classes), n_u)])
    read = jnp.concatenate([x_labelled, x_unlabelled])
    if config.labels.classifier_shift and shift_key is not None:
        first_key, second_key = jax.random.split(shift_key)
        shape = model.data.image_shape
        read = shift_images(first_key, read, config.labels.classifier_shift, image_shape=shape)
        if config.labels.consistency_weight > 0:
            read = jnp.concatenate([read, shift_images(second_key, x_unlabelled,
                                                       config.labels.classifier_shift,
                                                       image_shape=shape)])
    noise = objectives.draw_noise(z_key, model, samples=config.objective.importance_samples,
                                  batch=targets.shape[0])
    rows, class_logits, updates = objectives.row_terms(
        model, variables, images=targets, labels=labels, noise=noise,
        objective=config.objective.bound, kl_weight=kl_weight, train=train, rngs=rngs,
        mutable=mutable, also=lambda module: module.classify(read, train=train))
    second = class_logits[n_l + n_u:] if class_logits.shape[0] > n_l + n_u else None
    return (class_logits[:n_l + n_u], rows, n_l, second), updates


def semi_supervised_loss(outputs, *, config: Config, kl_weight, labelled_share: float,
                         y_labelled):
    """The batch estimate of J^alpha / N (module docstring) and its terms, from
    `per_label_terms`.

    Each row's negative bound is weighed as M2 weighs it: a labelled row labelled_share / n_l,
    unlabelled row (i, y) (1 - labelled_share) q(y|x_i) / n_u (`objectives.batch_loss`, which
    also floors each latent dimension's weighted mean KL with free bits). With second logits,
    `consistency_weight` times the mean squared difference of the two readings'
    probabilities of each unlabelled image is added (the Pi-model's consistency).
    `entropy_weight` times the unlabelled images' mean entropy of q(y|x) is added (entropy
    minimisation, Grandvalet and Bengio 2005): M2's own -H(q(y|x)) pushes the readings towards
    uniform, this pulls them to a decision.
    -> (loss, {"loss", "reconstruction", "kl", "labelled_loss", "unlabelled_loss",
    "classifier_cross_entropy", "classifier_accuracy", "entropy", "consistency"});
    reconstruction and KL are the expected terms over all images of the batch (q(y|x)-weighted
    for the unlabelled).
    """
    class_logits, rows, n_l, second = outputs
    classes = class_logits.shape[-1]
    log_q = jax.nn.log_softmax(class_logits[n_l:])  # unlabelled: f32[n_u, C]
    q = jnp.exp(log_q)
    n_u = q.shape[0]

    def by_label(values):  # unlabelled rows -> f32[n_u, C]
        return values[n_l:].reshape(-1, classes)

    weights = jnp.concatenate([jnp.full((n_l,), labelled_share / n_l),
                               (1.0 - labelled_share) * q.reshape(-1) / n_u])
    bound_loss, _ = objectives.batch_loss(rows, objective=config.objective.bound,
                                          kl_weight=kl_weight,
                                          free_bits=config.objective.free_bits, weights=weights)
    entropy = -jnp.sum(q * log_q, axis=-1)
    unlabelled = jnp.sum(q * by_label(rows.neg_bound), axis=-1) - entropy
    cross_entropy = optax.softmax_cross_entropy_with_integer_labels(class_logits[:n_l],
                                                                    y_labelled)
    consistency = (jnp.zeros(()) if second is None else
                   jnp.sum(jnp.square(q - jax.nn.softmax(second)), axis=-1).mean())
    loss = (bound_loss - (1.0 - labelled_share) * entropy.mean()
            + config.labels.classifier_weight * cross_entropy.mean()
            + config.labels.consistency_weight * consistency
            + config.labels.entropy_weight * entropy.mean())

    def expected(values):  # labelled rows as they are, unlabelled ones under q(y|x)
        return jnp.concatenate([values[:n_l], jnp.sum(q * by_label(values), axis=-1)]).mean()

    terms = {"loss": loss, "reconstruction": expected(rows.reconstruction),
             "kl": expected(rows.kl), "labelled_loss": rows.neg_bound[:n_l].mean(),
             "unlabelled_loss": unlabelled.mean(),
             "classifier_cross_entropy": cross_entropy.mean(),
             "classifier_accuracy": jnp.mean(jnp.argmax(class_logits[:n_l], -1) == y_labelled),
             "entropy": entropy.mean(), "consistency": consistency}
    return loss, terms


def _unit_rows(vectors: jax.Array) -> jax.Array:
    """Each row scaled to unit L2 norm (a zero row stays zero)."""
    norms = jnp.sqrt(jnp.sum(jnp.square(vectors), axis=-1, keepdims=True))
    return vectors / jnp.maximum(norms, 1e-12)


# The power iteration's probe length (Miyato et al. 2018's xi): small, so its one step measures
# the divergence's curvature at the image, not its shape further out. The paper's 1e-6 is below
# float32's reach: there the gradient is rounding noise (its direction's cosine with float64's
# is -0.97 on a random MLP), from 3e-3 to 3e-2 it is above 0.9998.
VAT_PROBE_LENGTH = 1e-2


def virtual_adversarial_loss(classify: Callable, images: jax.Array, key: jax.Array, *,
                             epsilon: float) -> jax.Array:
    """Virtual adversarial training's smoothness term (Miyato et al. 2018): the mean over rows
    of KL(q(y|x) || q(y|x + r_adv)), r_adv the perturbation of L2 norm `epsilon` that changes
    the reading most, found by one power iteration from a random direction. The reading at x
    is a constant (stop_gradient): only the reading at x + r_adv is pulled towards it. Needs no
    label, so every image of the batch takes part.

    `classify`: images f32[B, P] -> logits f32[B, C], a pure function of the parameters
    being trained. -> f32[].
    """
    clean = jax.lax.stop_gradient(jax.nn.log_softmax(classify(images)))

    def divergence(perturbation):  # per row, f32[B]
        moved = jax.nn.log_softmax(classify(images + perturbation))
        return jnp.sum(jnp.exp(clean) * (clean - moved), axis=-1)

    direction = _unit_rows(jax.random.normal(key, images.shape))
    gradient = jax.grad(lambda r: divergence(r).sum())(VAT_PROBE_LENGTH * direction)
    adversarial = epsilon * _unit_rows(jax.lax.stop_gradient(gradient))
    return divergence(adversarial).mean()


def create_semi_train_chunk(train_step: Callable, config: Config) -> Callable:
    """`train_chunk(state, images, labels, orders, first, key, num_steps) -> (state, metrics)`.

    `orders` = (labelled file rows i32[N_l], unlabelled file rows i32[N_u]), each in this
    epoch's order. Batch i of the chunk is the labelled rows at (first + i) * n_l + 0..n_l - 1
    (cycled modulo N_l), then the unlabelled rows (first + i) * n_u ... Only the labelled rows'
    labels are read. The batch reaches the step as {"image": f32[B, P], "label": i32[n_l]}.
    """
    n_l = config.labels.labelled_per_batch
    n_u = config.run.batch_size - n_l

    @functools.partial(jax.jit, donate_argnums=0)
    def train_chunk(state, images, labels, orders, first, key, num_steps):
        labelled_order, unlabelled_order = orders

        def body(state, i):
            batch_index = first + i
            labelled_rows = labelled_order[(batch_index * n_l + jnp.arange(n_l))
                                           % labelled_order.shape[0]]
            unlabelled_rows = jax.lax.dynamic_slice_in_dim(unlabelled_order, batch_index * n_u,
                                                           n_u)
            rows = jnp.concatenate([labelled_rows, unlabelled_rows])
            batch = {"image": to_unit(images[rows]),
                     "label": labels[labelled_rows].astype(jnp.int32)}
            return train_step(state, batch, key)

        return fused_steps(body, state, num_steps, max_steps=config.run.steps_per_call)

    return first_rows(train_chunk, config.run.steps_per_call)


def create_read_labels_fn(model, batch_size: int = 1000) -> Callable:
    """Jitted `read_labels(variables, images_u8 u8[N, P]) -> i32[N]`: the label q(y|x) gives
    each image (its argmax), in batches. (The sampler's `create_classify_fn` gives the
    probabilities, through its fixed blocks.)"""

    @jax.jit
    def read_labels(variables, images_u8):
        n = images_u8.shape[0]
        size = min(batch_size, n)
        padded = jnp.pad(images_u8, ((0, -n % size), (0, 0)))

        def one(start):
            rows = to_unit(jax.lax.dynamic_slice_in_dim(padded, start, size))
            return jnp.argmax(model.apply(variables, rows, method="classify"), axis=-1)

        return jax.lax.map(one, jnp.arange(0, padded.shape[0], size)).reshape(-1)[:n]

    return read_labels


def choose_labelled_set(split, config: Config) -> dict[str, np.ndarray]:
    """The labelled set of a `--labels N` run: {"positions": rows of the training part,
    "indices": rows of the training file, "labels"}, all i32[N]
    (`cvae.data.splits.labelled_indices`).
    """
    file_rows = split.train_indices
    positions = labelled_indices(split.train_labels, file_rows, count=config.labels.labelled_count,
                                 num_classes=spec_of(config.data.dataset).num_classes,
                                 seed=config.run.seed)
    return {"positions": positions.astype(np.int32),
            "indices": np.asarray(file_rows[positions], np.int32),
            "labels": np.asarray(split.train_labels[positions], np.int32)}


def check_labelled_set(stored: dict, chosen: dict, checkpoint_dir) -> None:
    """A resumed run must train on the labelled set it started with: a different one means the
    training file changed (or the split did), and the run would not be the same run."""
    same = all(np.array_equal(np.asarray(stored[name]), chosen[name])
               for name in ("indices", "labels"))
    if not same:
        raise ResumeError(f"{checkpoint_dir} holds a run trained on another labelled set (the "
                          f"training file or its labels changed since): pass --fresh to start "
                          f"over, or use another --checkpoint-dir")


def unlabelled_positions(num_training: int, labelled_positions: np.ndarray) -> np.ndarray:
    """Rows of the training part that train without their labels: i32[N - N_l]."""
    keep = np.ones(num_training, bool)
    keep[labelled_positions] = False
    return np.flatnonzero(keep).astype(np.int32)


def create_error_fn(model) -> Callable:
    """`error(variables, images_u8 u8[N, P], labels i32[N]) -> float`: q(y|x)'s error rate."""
    read_labels = create_read_labels_fn(model)

    def error(variables, images_u8, labels) -> float:
        return float(jnp.mean(read_labels(variables, images_u8) != labels))

    return error
