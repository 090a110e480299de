"""Train state and the jitted pieces of training: one step and a fused chunk of steps.

All randomness is derived from (seed, step): the step folds its own count into the run's key,
and each epoch's data order is a permutation keyed by (seed, epoch). A resumed run therefore
needs no RNG state beyond the step to see the same batches and the same noise.
The dataset lives on the device; a chunk of up to `steps_per_call` steps runs inside one device
loop, so the host only wakes up to log and checkpoint. The chunk's length is a traced value, so
one compiled program serves every length (`fused_steps`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax.sharding import Mesh

from cvae.config.sections import Config
from cvae.data.pixels import to_unit
from cvae.model.binarization import maybe_binarize
from cvae.model.registry import init_variables
from cvae.training.optimizer import create_kl_weight_schedule
from cvae.training.devices import check_divisible, gather_rows, replicate, shard_batch

class StepKeys(NamedTuple):
    """The keys one train step draws from (its own, folded from the run key and the step)."""

    z: jax.Array  # the reparameterisation noise
    dropout: jax.Array
    shift: jax.Array  # q(y|x)'s random shifts (`--classifier-shift`)
    vat: jax.Array  # virtual adversarial training's random directions (`--vat-weight`)


Batch = dict[str, jax.Array]  # {"image": float32[B, P] in [0, 1], "label": int32[B]}
Metrics = dict[str, jax.Array]

# Streams folded into the run key, so each use of randomness is independent of the others.
_PARAMS_STREAM, _STEP_STREAM, _DATA_STREAM, _EVAL_STREAM, _PRIOR_STREAM = range(5)
_LABELLED_STREAM = 5  # the labelled images' order under --labels N


class TrainState(train_state.TrainState):
    """Flax TrainState plus what a VAE run needs to resume and to sample."""

    batch_stats: Any = flax.struct.field(default_factory=dict)
    prior: Any = flax.struct.field(default_factory=dict)  # the fitted mixture, if the run has one
    ema_params: Any = None
    # With --labels N: {"indices": i32[N] (rows of the training file), "labels": i32[N]}, the
    # labelled set, so a resume can check it trains on the same one. Empty with every label.
    labelled: Any = flax.struct.field(default_factory=dict)
    key: jax.Array = None  # the run key, raw uint32 data; every other key is folded from it

    def eval_variables(self, use_ema: bool = True) -> dict:
        """Variables for evaluation and sampling: EMA weights when kept."""
        params = self.ema_params if (use_ema and self.ema_params is not None) else self.params
        return {"params": params, **({"batch_stats": self.batch_stats} if self.batch_stats else {}),
                **({"prior": self.prior} if self.prior else {})}


def run_key(seed: int) -> jax.Array:
    return jax.random.key(seed)


def stream_key(key: jax.Array, stream: int) -> jax.Array:
    return jax.random.fold_in(key, stream)


def eval_key(key: jax.Array) -> jax.Array:
    """The key of evaluation's noise (binarisation, z), independent of training's."""
    return stream_key(key, _EVAL_STREAM)


def create_train_state(model, optimizer: optax.GradientTransformation, config: Config, *,
                       key: jax.Array) -> TrainState:
    variables = init_variables(model, stream_key(key, _PARAMS_STREAM))
    params = variables["params"]
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=optimizer,
        batch_stats=variables.get("batch_stats", {}), prior=variables.get("prior", {}),
        # Copies, not aliases: the state is donated to the step, its buffers must be its own.
        ema_params=jax.tree.map(jnp.copy, params) if config.optimizer.ema_decay > 0 else None,
        labelled=empty_labelled_set(model),
        key=jnp.copy(jax.random.key_data(key)))
    # A concrete int32 step (not Python's weakly typed 0), so the first call of the jitted step
    # and every later one share a single compiled program.
    return state.replace(step=jnp.zeros((), jnp.int32))


def empty_labelled_set(model) -> dict:
    """The labelled set's place in the state of a model with a classifier (zeros until the
    run's supervision fills it in, `cvae.training.supervision`): its shape is part of the
    checkpoint's structure. Empty for a model trained with every label."""
    if not model.has_classifier:
        return {}
    return {name: jnp.zeros((model.labelled,), jnp.int32)
            for name in ("indices", "labels")}


def create_train_step(model, optimizer: optax.GradientTransformation, config: Config, *,
                      key: jax.Array, supervision, learning_rate_fn: optax.Schedule | None = None,
                      mesh: Mesh | None = None) -> tuple[TrainState, Callable]:
    """Initialise the state and build `train_step(state, batch, key) -> (state, metrics)`.

    `key` passed to the step is the run key; the step folds in `state.step`, so the caller never
    splits keys on the host. The returned step is jitted with the state donated. With a `mesh`,
    the state is replicated over its devices and each batch is split across them.
    `learning_rate_fn` (of the optimizer update count) only adds the rate to the metrics.
    The loss is the `supervision`'s (`cvae.training.supervision`: `FullLabels(config)` for the
    conditional VAE's negative ELBO, every image labelled).
    """
    state = create_train_state(model, optimizer, config, key=key)
    if mesh is not None:
        check_divisible(config.run.batch_size, mesh)
        supervision.check_devices(mesh)
        state = replicate(state, mesh)
    train_step = train_step_of(model, config, supervision=supervision,
                               use_batch_norm=bool(state.batch_stats),
                               learning_rate_fn=learning_rate_fn, mesh=mesh)
    return state, jax.jit(train_step, donate_argnums=0)


def train_step_of(model, config: Config, *, supervision, use_batch_norm: bool,
                  learning_rate_fn: optax.Schedule | None = None,
                  mesh: Mesh | None = None) -> Callable:
    """`train_step(state, batch, key) -> (state, metrics)`, not jitted (`create_train_step`
    jits it with the state donated); `use_batch_norm`: whether the state keeps BatchNorm's
    statistics."""
    kl_weight_at = create_kl_weight_schedule(config)

    def train_step(state: TrainState, batch: Batch, key: jax.Array):
        if mesh is not None:
            batch = shard_batch(batch, mesh)
        step_key = jax.random.fold_in(stream_key(key, _STEP_STREAM), state.step)
        z_key, dropout_key, binarize_key = jax.random.split(step_key, 3)
        images = maybe_binarize(binarize_key, batch["image"], config)
        kl_weight = kl_weight_at(state.step)
        shift_key = jax.random.fold_in(step_key, 1)
        keys = StepKeys(z=z_key, dropout=dropout_key, shift=shift_key,
                        vat=jax.random.fold_in(shift_key, 2))

        def loss_fn(params):
            variables = {"params": params}
            if use_batch_norm:
                variables["batch_stats"] = state.batch_stats
            return supervision.loss(model, variables, images=images, labels=batch["label"],
                                    keys=keys, kl_weight=kl_weight,
                                    mutable=["batch_stats"] if use_batch_norm else [])

        (_, (terms, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        new_state = state.apply_gradients(grads=grads)
        if use_batch_norm:
            new_state = new_state.replace(batch_stats=updates["batch_stats"])
        if config.optimizer.ema_decay > 0:
            new_state = new_state.replace(ema_params=ema_update(
                state.ema_params, new_state.params, ema_decay_at(new_state.step,
                                                                 config.optimizer.ema_decay)))
        metrics = {**terms, "grad_norm": optax.tree.norm(grads), "kl_weight": kl_weight}
        if learning_rate_fn is not None:
            metrics["learning_rate"] = learning_rate_fn(
                state.step // config.optimizer.accumulation_steps)
        return new_state, metrics

    return train_step


def ema_decay_at(updates, decay: float):
    """The decay after `updates` updates: min(decay, (1 + t) / (10 + t)), the warm-up of
    TensorFlow's ExponentialMovingAverage. Without it the average of a short run stays close to
    the random initial weights (0.999 keeps 25% of them after 1400 steps)."""
    return jnp.minimum(decay, (1.0 + updates) / (10.0 + updates))


def ema_update(ema, params, decay: float):
    return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)


def device_arrays(images, labels) -> tuple[jax.Array, jax.Array]:
    """uint8[N, H, W(, C)], int[N] -> on the device as uint8[N, P] (flattened), int32[N]."""
    return jnp.asarray(images.reshape(len(images), -1)), jnp.asarray(labels, jnp.int32)


def to_batch(images_u8: jax.Array, labels: jax.Array) -> Batch:
    """uint8[B, H * W * C] pixels -> the float batch the model reads."""
    return {"image": to_unit(images_u8), "label": labels.astype(jnp.int32)}


def epoch_permutation(key: jax.Array, epoch: int, num_examples: int) -> jax.Array:
    """The data order of one epoch; depends only on (run key, epoch)."""
    return jax.random.permutation(jax.random.fold_in(stream_key(key, _DATA_STREAM), epoch),
                                  num_examples)


def labelled_permutation(key: jax.Array, epoch: int, num_labelled: int) -> jax.Array:
    """The labelled images' order in one epoch (`--labels N`); depends only on (key, epoch)."""
    return jax.random.permutation(jax.random.fold_in(stream_key(key, _LABELLED_STREAM), epoch),
                                  num_labelled)


def create_train_chunk(train_step: Callable, batch_size: int, mesh: Mesh | None = None, *,
                       max_steps: int) -> Callable:
    """`train_chunk(state, images, labels, order, first, key, num_steps) -> (state, metrics)`.

    Runs `num_steps` (at most `max_steps`) train steps in one device call; batch i of the chunk
    is images[order[(first + i) * B : (first + i + 1) * B]]. Metrics come back stacked
    [num_steps]. With a `mesh`, each device gathers only its own rows of every batch
    (`gather_rows`).
    """

    def gather_batch(images, labels, order, start):
        if mesh is None:
            idx = jax.lax.dynamic_slice_in_dim(order, start, batch_size)
            return images[idx], labels[idx]
        return gather_rows(mesh, (images, labels), order, start=start, batch_size=batch_size)

    @functools.partial(jax.jit, donate_argnums=0)
    def train_chunk(state, images, labels, order, first, key, num_steps):
        def body(state, i):
            rows, row_labels = gather_batch(images, labels, order, (first + i) * batch_size)
            return train_step(state, to_batch(rows, row_labels), key)

        return fused_steps(body, state, num_steps, max_steps=max_steps)

    return first_rows(train_chunk, max_steps)


def fused_steps(body: Callable, state, num_steps: jax.Array, *, max_steps: int):
    """`body(state, i) -> (state, metrics)` for i in [0, num_steps), in one loop whose length is
    a traced value: one compiled program serves every chunk length, so the short chunk at an
    epoch's or a run's end, or a resume's first one, costs no compile and runs the same code.
    -> (state, metrics stacked [max_steps], rows past num_steps zero)."""

    def step(i, carry):
        state, stacked = carry
        state, metrics = body(state, i)
        return state, jax.tree.map(lambda rows, value: rows.at[i].set(value), stacked, metrics)

    shapes = jax.eval_shape(body, state, jnp.int32(0))[1]
    stacked = jax.tree.map(lambda s: jnp.zeros((max_steps, *s.shape), s.dtype), shapes)
    return jax.lax.fori_loop(0, num_steps, step, (state, stacked))


def first_rows(train_chunk: Callable, max_steps: int) -> Callable:
    """The jitted chunk as callers use it: `num_steps` checked against `max_steps`, and its
    metrics cut to the `num_steps` rows that ran, on the host. `.jitted` is the jitted chunk
    (to lower it, or count its compiled programs)."""

    def run(state, images, labels, order, first, key, num_steps: int):
        if not 1 <= num_steps <= max_steps:
            raise ValueError(f"num_steps={num_steps}: a chunk runs 1 to {max_steps} steps")
        state, metrics = train_chunk(state, images, labels, order, first, key, num_steps)
        return state, jax.tree.map(lambda rows: rows[:num_steps], jax.device_get(metrics))

    run.jitted = train_chunk
    return run


def prior_fit_key(key: jax.Array, epoch: int) -> jax.Array:
    """The key of the mixture prior's fit after `epoch` (binarisation, codes, EM starts)."""
    return jax.random.fold_in(stream_key(key, _PRIOR_STREAM), epoch)
