"""What one training step of a config costs on this machine: what the epochs that `cvae train`
chooses (cvae/training/choices.py) are sized by.

The step is timed as training runs it: the run's own model, optimizer and loss, in the fused
chunk of steps the loop calls (`cvae.training.step.create_train_chunk`), at the run's batch,
on images of the data's shape. An estimate from its parts (matrix products at a share of the
matrix rate, the likelihood and the optimizer timed apart) came to 1.4 to 1.7 times the real
step on a 2-core Xeon, and under it on 64x64 colour on an EPYC (experiments/LOG.md,
2026-11-30): the parts do not add up to the fused program XLA compiles. Timing that program
costs its compile and a second of steps before training, and holds for every family and
architecture alike. Steps are timed several to a call, as training runs them (up to
`--steps-per-call`, a call kept under about `CALL_SECONDS`): a call of one step also costs the
call itself, about 12 ms on a 2-core AMD EPYC, where Fashion-MNIST's step is about 40 ms
(experiments/LOG.md, 2026-12-01), and the chosen epochs then ended after 21 of the 30 minutes.

With `--labels N` the step timed is the fully labelled one (M2's step, which decodes every
unlabelled image under each class, costs more): the few-label runs are not sized by it.

Synopsis:

    cost = measure_step(config, data)       # StepCost(seconds=..., steps=...)
    epochs = budget_seconds // (cost.seconds * steps_per_epoch)
"""

from __future__ import annotations

import dataclasses
import time

from cvae.config.sections import Config
from cvae.data.profile import DataProfile

MIN_TIMED_CALLS = 2  # calls timed after the one that compiles and the one that sizes them
TIMED_SECONDS = 1.0  # and more while their time is under this (at most MAX_TIMED_CALLS)
MAX_TIMED_CALLS = 10
CALL_SECONDS = 0.5  # a timed call runs as many steps as fit this (one, for a slow step)


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Seconds of one training step at the config's batch: the median over `calls` timed calls
    of the training chunk, `steps` steps in all."""

    seconds: float
    steps: int
    calls: int = 1


def measure_step(config: Config, data: DataProfile) -> StepCost:
    """One training step of `config` on images of `data`'s shape, timed here (process 0's
    figure in a run of several, so every process chooses alike)."""
    from cvae.training import processes

    run_steps = _timed_steps(config, data)
    run_steps(1)  # compiles
    start = time.perf_counter()
    run_steps(1)
    per_call = max(1, min(config.run.steps_per_call,
                          int(CALL_SECONDS / (time.perf_counter() - start))))
    times: list[float] = []
    while len(times) < MIN_TIMED_CALLS or (sum(times) < TIMED_SECONDS
                                           and len(times) < MAX_TIMED_CALLS):
        start = time.perf_counter()
        run_steps(per_call)
        times.append(time.perf_counter() - start)
    seconds = sorted(times)[len(times) // 2] / per_call
    return StepCost(processes.from_process_zero(seconds), len(times) * per_call, len(times))


def _timed_steps(config: Config, data: DataProfile):
    """`run_steps(n)`: n steps in one call of the training chunk of a fresh state of `config`,
    on random images of `data`'s shape (nothing of them is kept); returns when they have run."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from cvae.data.specs import DatasetSpec
    from cvae.model.registry import create_model
    from cvae.training.optimizer import create_optimizer
    from cvae.training.step import (create_train_chunk, create_train_state, run_key,
                                    train_step_of)
    from cvae.training.supervision import FullLabels

    spec = DatasetSpec(config.data.dataset, config.data.dataset, config.data.dataset,
                       data.height, data.width, data.channels,
                       tuple(str(label) for label in range(max(1, data.classes))), None)
    batch = config.run.batch_size
    model = create_model(config, spec)
    # Its schedule spans the steps timed here; a span does not change what a step costs.
    optimizer, _ = create_optimizer(config, 2 + MAX_TIMED_CALLS * config.run.steps_per_call)
    key = run_key(config.run.seed)
    # Initialised in one compiled program, not op by op as a run's first state is (its values
    # differ, its shapes and its step's cost do not): seconds less on a cold cache.
    state = jax.jit(lambda key: create_train_state(model, optimizer, config, key=key))(key)
    train_step = train_step_of(model, config, supervision=FullLabels(config),
                               use_batch_norm=bool(state.batch_stats))
    most = config.run.steps_per_call
    chunk = create_train_chunk(jax.jit(train_step, donate_argnums=0), batch, max_steps=most)
    pixels = np.random.default_rng(0).integers(0, 256, (batch, data.values), dtype=np.uint8)
    images = jnp.asarray(pixels)
    labels = jnp.asarray(np.arange(batch) % spec.num_classes, jnp.int32)
    order = jnp.asarray(np.arange(most * batch) % batch, jnp.int32)  # the images again
    held = [state]

    def run_steps(count: int):
        held[0], _ = chunk(held[0], images, labels, order, 0, key, num_steps=count)

    return run_steps
