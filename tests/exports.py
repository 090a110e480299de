"""Tiny exported models, one per model option, for the export tests (a pytest plugin that
tests/conftest.py loads).

    folder = exported("mixture")     # the folder `cvae export` wrote; shared: read-only
    run = export_runs("mixture")     # the TrainedRun it came from

Each option is trained (2 epochs of 80 synthetic digits, the test config) and exported once
per test session, in whichever xdist worker asks first: the others wait on a file lock and
reuse its folders, so the suite pays for each export once (about 10-25 s each on 2 cores). The
standard option's run is the `trained_run` fixture's (tests/conftest.py), trained once for both.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import pytest

from cvae.config import presets
from cvae.data.synthetic import synthetic_dataset

# Every model option the export covers: the standard prior (the test config), the per-class
# mixture prior with BatchNorm and EMA weights, drawn truncated as the default draws, the
# few-label model's classifier q(y|x) (with the mixture prior, as `--preset semi` has), and the
# ladder VAE (two layers, its noise 4 + 3 wide, the mixture fitted to its top layer's codes,
# its top layer's noise truncated). (`--architecture conv` exports too, a
# trained one's ONNX within 2e-6: left out here for the suite's time, its convolutions cost most
# on a CPU.)
OPTIONS = {
    "standard": lambda: presets.test().replace(epochs=2),
    "mixture": lambda: presets.test().replace(
        prior="mixture", prior_components=2, prior_codes="means", epochs=2, batch_norm=True,
        ema_decay=0.9, truncation=0.75),
    "few-labels": lambda: presets.test().replace(
        prior="mixture", prior_components=2, prior_codes="means", epochs=2, labels="20",
        labelled_per_batch=4),
    "ladder": lambda: presets.test().replace(
        model="ladder", stochastic_layers=2, upper_latent_dim=3, prior="mixture",
        prior_components=2, prior_codes="means", epochs=2, free_bits=0.05, kl_schedule="linear",
        kl_warmup_steps=6, truncation=0.6),
}


def shared_root(tmp_path_factory) -> Path:
    """A folder every xdist worker of this session sees (this session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "exports"
    root.mkdir(exist_ok=True)
    return root


@contextlib.contextmanager
def locked(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def export_runs(tmp_path_factory):
    """kind -> the TrainedRun of that option (trained on first use in the session)."""
    from conftest import TrainedRun, train_run

    root = shared_root(tmp_path_factory)

    def get(kind: str) -> TrainedRun:
        if kind == "standard":  # the same config and data as the `trained_run` fixture's
            from conftest import shared_train_run

            return shared_train_run(tmp_path_factory, "trained-run", OPTIONS[kind](),
                                    synthetic_dataset(80))
        directory, config = root / f"run-{kind}", OPTIONS[kind]()
        with locked(root / f"run-{kind}.lock"):
            if not (directory / "trained").is_file():
                train_run(directory, config, synthetic_dataset(80))
                (directory / "trained").write_text("")
        steps = tuple(sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()))
        return TrainedRun(directory, config, synthetic_dataset(80), steps)
    return get


@pytest.fixture(scope="session")
def exported(tmp_path_factory, export_runs):
    """kind -> the folder `cvae export` wrote for that option (exported on first use)."""
    from cvae.export.run import export_checkpoint

    root = shared_root(tmp_path_factory)

    def get(kind: str) -> Path:
        folder = root / f"exported-{kind}"
        run = export_runs(kind)
        with locked(root / f"exported-{kind}.lock"):
            if not (folder / "manifest.json").is_file():
                export_checkpoint(run.directory, folder, log=lambda message: None)
        return folder
    return get
