import json

import numpy as np
from PIL import Image

from cvae.config import presets
from cvae.training.callbacks import (Callback, Checkpointer, EarlyStopping, LossCurve,
                                     MetricsLogger, Run, TensorBoard)
from cvae.training.checkpoints import load_checkpoint
from cvae.training.loop import train_and_evaluate
from cvae.data.synthetic import synthetic_dataset


class ScriptedLoss(Callback):
    """Replaces the validation loss with a script, so early stopping sees known values."""

    def __init__(self, losses):
        self.losses = list(losses)

    def on_eval_end(self, run, metrics):
        metrics["loss"] = self.losses[run.epoch]


def test_early_stopping_stops_at_the_right_epoch_and_leaves_a_checkpoint(tmp_path):
    config = presets.test().replace(epochs=10)
    script = ScriptedLoss([5.0, 4.0, 4.0, 3.95, 3.99, 1.0, 1.0, 1.0, 1.0, 1.0])
    run = train_and_evaluate(config, synthetic_dataset(80), tmp_path,
                             callbacks=[script, EarlyStopping(patience=2, min_delta=0.1),
                                        Checkpointer()])
    # epoch 2: 4.0 (no 0.1 gain), epoch 3: 3.95 (still < 0.1 below 4.0) -> stop after epoch 4
    assert run.epoch == 3 and run.step == 16
    assert "early stopping" in run.stop_reason and run.exit_code == 0
    assert load_checkpoint(tmp_path).step == 16


def test_metrics_logger_uses_the_injected_clock_and_weights_steps(tmp_path):
    ticks = iter([10.0, 12.5])
    logger = MetricsLogger(clock=lambda: next(ticks))
    run = Run(presets.test(), tmp_path, steps_per_epoch=3, total_steps=3)
    logger.on_epoch_start(run)
    logger.on_step_end(run, {"loss": np.array([1.0, 2.0])})
    logger.on_step_end(run, {"loss": np.array([6.0])})
    run.step = 3
    logger.on_epoch_end(run, {"loss": 7.0})
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["train_loss"] == 3.0  # (1 + 2 + 6) / 3 steps, not the mean of chunk means
    assert record["seconds"] == 2.5 and record["validation_loss"] == 7.0
    assert record["examples_per_second"] == 3 * 16 / 2.5


def test_a_metrics_record_spans_every_epoch_since_the_last_evaluation(tmp_path):
    ticks = iter([10.0, 14.0, 15.0, 16.0])  # the second epoch starts without a record between
    logger = MetricsLogger(clock=lambda: next(ticks))
    run = Run(presets.test().replace(eval_every=2), tmp_path, steps_per_epoch=1,
              total_steps=3)
    for epoch, loss in ((0, 1.0), (1, 5.0)):
        run.epoch = epoch
        logger.on_epoch_start(run)
        logger.on_step_end(run, {"loss": np.array([loss])})
    run.step = 2
    logger.on_epoch_end(run, {"loss": 7.0})
    run.epoch = 2
    logger.on_epoch_start(run)  # after a record: a new span starts here
    logger.on_step_end(run, {"loss": np.array([2.0])})
    run.step = 3
    logger.on_epoch_end(run, {"loss": 6.0})
    first, second = map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert (first["epoch"], first["train_loss"], first["seconds"]) == (2, 3.0, 4.0)
    assert first["examples_per_second"] == 2 * 16 / 4.0
    assert (second["epoch"], second["train_loss"], second["seconds"]) == (3, 2.0, 1.0)


def test_tensorboard_and_loss_curve_files_are_written(tmp_path):
    config = presets.test().replace(epochs=2)
    train_and_evaluate(config, synthetic_dataset(80), tmp_path,
                       callbacks=[MetricsLogger(), TensorBoard(), LossCurve()])
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100
    with Image.open(tmp_path / "loss_curve.png") as image:
        assert image.format == "PNG" and image.size == (1000, 400)  # 10 x 4 inches at 100 dpi
