"""`cvae eval`: test-set figures of a checkpoint, from the checkpoint directory alone."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp

from cvae.checkpoint import load_checkpoint
from cvae.data import load_dataset
from cvae.model import create_model
from cvae.train import create_eval_step, evaluate, run_key


def elbo_metrics(checkpoint, data) -> dict[str, float]:
    """Reconstruction, KL, loss and negative ELBO (nats) on the whole test set."""
    config = checkpoint.config
    eval_step = create_eval_step(create_model(config), config)
    return evaluate(eval_step, checkpoint.state.eval_variables(),
                    jnp.asarray(data.test_images.reshape(-1, 784)),
                    jnp.asarray(data.test_labels, jnp.int32), run_key(config.seed),
                    config.eval_batch_size)


def run_eval(args) -> int:
    checkpoint = load_checkpoint(args.checkpoint_dir)
    data = load_dataset(args.data_dir, checkpoint.config.dataset, checkpoint.config.data_source)
    metrics = {"step": checkpoint.step, **elbo_metrics(checkpoint, data)}
    for name, value in metrics.items():
        print(f"{name:>16}  {value:.4f}" if isinstance(value, float) else f"{name:>16}  {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return 0
