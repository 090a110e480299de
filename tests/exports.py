"""Tiny exported models, one per model option, for the export tests (a pytest plugin that
tests/conftest.py loads).

    folder = exported("mixture")     # the folder `cvae export` wrote; shared: read-only
    run = export_runs("mixture")     # the TrainedRun it came from

Each option is trained once per session (2 epochs of 80 synthetic digits, the test config)
and exported once, in process: about 15-30 s each on 2 CPU cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cvae import config as config_lib
from cvae.data.synthetic import synthetic_dataset

# Every model option the export covers: the standard prior (the test config), the per-class
# mixture prior with BatchNorm and EMA weights, and the few-label model's classifier q(y|x)
# (with the mixture prior, as `--preset semi` has). (`--architecture conv` exports too, its
# ONNX within 1e-7: left out here for the suite's time, its convolutions cost most on a CPU.)
OPTIONS = {
    "standard": lambda: config_lib.test().replace(epochs=2),
    "mixture": lambda: config_lib.test().replace(
        prior="mixture", prior_components=2, epochs=2, batch_norm=True, ema_decay=0.9),
    "few-labels": lambda: config_lib.test().replace(
        prior="mixture", prior_components=2, epochs=2, labels="20", labelled_per_batch=4),
}


@pytest.fixture(scope="session")
def export_runs(tmp_path_factory):
    """kind -> the TrainedRun of that option (trained on first use)."""
    from conftest import train_run

    runs = {}

    def get(kind: str):
        if kind not in runs:
            runs[kind] = train_run(tmp_path_factory.mktemp(f"export-run-{kind}"),
                                   OPTIONS[kind](), synthetic_dataset(80))
        return runs[kind]
    return get


@pytest.fixture(scope="session")
def exported(tmp_path_factory, export_runs):
    """kind -> the folder `cvae export` wrote for that option (exported on first use)."""
    from cvae.export.run import export_checkpoint

    folders: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in folders:
            folder = tmp_path_factory.mktemp(f"exported-{kind}") / "model"
            export_checkpoint(export_runs(kind).directory, folder, log=lambda message: None)
            folders[kind] = folder
        return folders[kind]
    return get
