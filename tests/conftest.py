"""Shared fixtures. Keep each one cheap, documented, and session-scoped when it trains."""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

# Compiled programs are cached on disk for this session (JAX's persistent compilation cache),
# set before JAX loads so that this process, every pytest-xdist worker (they inherit the
# environment of the process that starts them) and every `cvae` subprocess share it. The suite
# starts many processes that compile the same tiny programs, and compilation is most of their
# time: a 96-step tiny training run took 8.1 s cold and 3.4 s with the cache. The directory is new
# for each session, so no program compiled by other code is ever reused; the process that made
# it removes it.
if "CVAE_TEST_COMPILATION_CACHE" not in os.environ:
    os.environ["CVAE_TEST_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="cvae-tests-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["CVAE_TEST_COMPILATION_CACHE"], ignore_errors=True)
# The settings `cvae serve` and `cvae sample` use (cvae/sampling/compilation_cache.py), so that
# the pytest workers' programs and their subprocesses' have the same keys.
os.environ.update(JAX_COMPILATION_CACHE_DIR=os.environ["CVAE_TEST_COMPILATION_CACHE"],
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
                  JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none")

# Compiling is most of the suite's CPU time and no test times a compiled program, so the suite
# compiles with LLVM's optimisation passes off (about a third less CPU on the compile-heavy
# files) and with XLA:CPU's loop emitters instead of its fusion emitters, which build an MLIR
# context per fused computation (a fifth less CPU again on three compile-heavy files). The
# numbers are the same: the default's first losses recorded under the production flags
# (tests/fixtures/default-first-losses.json) and the old checkpoints' PNG bytes
# (tests/test_store.py) come out identical, and a run resumed in chunks of any length gets the
# same bits, every chunk length being one program (cvae.training.step.fused_steps). A caller's
# XLA_FLAGS wins, even empty: `make test-kernels` runs every determinism claim again under the
# production flags and others.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                      " --xla_cpu_use_fusion_emitters=false")
os.environ.setdefault("XLA_FLAGS", FAST_COMPILE_FLAGS)


import pytest  # noqa: E402  (after the cache settings, which JAX reads when it loads)

from cvae.config import presets  # noqa: E402
from cvae.training.callbacks import Checkpointer  # noqa: E402
from cvae.config.sections import Config  # noqa: E402
from cvae.data.load import Dataset  # noqa: E402
from cvae.training.loop import train_and_evaluate  # noqa: E402
from cvae.data.synthetic import synthetic_dataset, write_synthetic_idx  # noqa: E402

pytest_plugins = ["exports"]  # tests/exports.py: tiny exported models (cvae export)


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """A tiny finished run: `directory` holds steps `steps` of `config` trained on `data`.

    Treat `directory` as read-only (it is shared by the whole session); `copy_to` gives a
    private copy to modify.
    """

    directory: Path
    config: Config
    data: Dataset
    steps: tuple[int, ...]

    def copy_to(self, target: Path, steps: tuple[int, ...] | None = None) -> Path:
        """Copy the run (only `steps`, if given) into `target`; returns `target`."""
        target.mkdir(parents=True, exist_ok=True)
        for step in steps or self.steps:
            shutil.copytree(self.directory / str(step), target / str(step))
        return target


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> TrainedRun:
    """Test config, 80 synthetic examples (16 held out for validation), 2 epochs of 4 steps:
    checkpoints at steps 4 and 8.

    About 5 s on 2 CPU cores (mostly compilation).
    """
    return shared_train_run(tmp_path_factory, "trained-run", presets.test().replace(epochs=2),
                            synthetic_dataset(80))


@pytest.fixture(scope="session")
def transfer_run(tmp_path_factory) -> TrainedRun:
    """The test config trained until its reconstructions mean something (20 epochs of 512
    synthetic digits, 16 of them held out): for style-transfer tests that bound how closely a
    digit is reconstructed and check that the model reads labels. About 10 s on 2 CPU cores."""
    return shared_train_run(tmp_path_factory, "transfer-run", presets.test().replace(epochs=20),
                            synthetic_dataset(512))


@pytest.fixture(scope="session")
def few_label_run(tmp_path_factory) -> TrainedRun:
    """The test config trained semi-supervised (`--labels 20`) on 256 synthetic digits (32 held
    out), 8 epochs: its classifier q(y|x) reads the synthetic test digits without a mistake.
    About 35 s on 2 busy CPU cores."""
    config = presets.test().replace(
        epochs=8, labels="20", labelled_per_batch=4, validation_size=32, classifier_weight=5.0,
        learning_rate=3e-3)
    return shared_train_run(tmp_path_factory, "few-label-run", config, synthetic_dataset(256))


@pytest.fixture(scope="session")
def four_device_runs(tmp_path_factory) -> dict:
    """Each data-parallel case trained on one and on four host devices in one 4-device
    subprocess (tests/four_devices.py), once a session: {"default" | "lever" | "semi": its
    losses, shardings and restored checkpoint}, and "directory", where its runs are (read-only).
    About 110 CPU-seconds, most of it compiling the lever programs."""
    import four_devices

    directory = shared_directory(tmp_path_factory, "four-devices", four_devices.run)
    return {**four_devices.results(directory), "directory": directory}


def train_run(directory: Path, config: Config, data: Dataset) -> TrainedRun:
    train_and_evaluate(config, data, directory, callbacks=[Checkpointer()])
    steps = tuple(sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()))
    return TrainedRun(directory, config, data, steps)


def shared_directory(tmp_path_factory, name: str, build) -> Path:
    """`build(directory)` once per test session, whichever xdist worker asks first; the others
    wait on a file lock and get the same folder. Read-only for its users, like a session
    fixture's (a run, a reference checkpoint): copy it to change it."""
    from exports import locked, shared_root  # (the plugin pytest_plugins loads)

    root = shared_root(tmp_path_factory)
    directory = root / name
    with locked(root / f"{name}.lock"):
        if not (root / f"{name}.done").is_file():
            if directory.exists():  # a build that failed half-way in an earlier test's hands
                shutil.rmtree(directory)
            directory.mkdir()
            build(directory)
            (root / f"{name}.done").write_text("")
    return directory


def shared_train_run(tmp_path_factory, name: str, config: Config, data: Dataset) -> TrainedRun:
    """`train_run` once per test session across the xdist workers (`shared_directory`)."""
    directory = shared_directory(
        tmp_path_factory, name, lambda folder: train_and_evaluate(config, data, folder,
                                                                  callbacks=[Checkpointer()]))
    steps = tuple(sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()))
    return TrainedRun(directory, config, data, steps)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The synthetic digits as the four MNIST IDX files (320 train, of which the last 64 are the
    validation split with `--validation-size 64`; 64 test), for `cvae train --data-dir`
    subprocesses. Read-only: shared by the whole session."""
    root = tmp_path_factory.mktemp("data")
    write_synthetic_idx(root, num_train=320, num_test=64)
    return root


# `cvae eval`'s fidelity classifier for `eval_data_dir`'s digits, as a first `cvae eval` caches
# it: training it takes about 190 s on 2 cores, so the session copies it instead. A stale copy (the
# synthetic digits or the classifier's recipe changed) is not used: it is trained again, and
# tests/test_fidelity.py fails until `CVAE_REFRESH_EVAL_CLASSIFIER=1` rewrites it.
EVAL_CLASSIFIER = Path(__file__).parent / "fixtures" / "eval-classifier"
EVAL_DIGITS = {"num_train": 512, "num_test": 64}


def write_eval_data(directory: Path, log=lambda _: None) -> None:
    """`eval_data_dir`'s contents: the synthetic digits as IDX files, and in `classifier/` the
    fidelity classifier `cvae eval` reads them with (the copy above, or trained if stale)."""
    from cvae.data.load import load_dataset
    from cvae.evaluation.fidelity import load_or_train_classifier

    write_synthetic_idx(directory, **EVAL_DIGITS)
    shutil.copytree(EVAL_CLASSIFIER, directory / "classifier")
    load_or_train_classifier(load_dataset(directory), directory / "classifier", log=log)


@pytest.fixture(scope="session")
def eval_data_dir(tmp_path_factory) -> Path:
    """The synthetic digits as MNIST IDX files (512 train, 64 test) with `cvae eval`'s fidelity
    classifier cached in `classifier/` beside them, as a first `cvae eval` leaves it.
    Read-only: shared by the whole session (`shared_directory`)."""
    return shared_directory(tmp_path_factory, "eval-data", write_eval_data)


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (user + system)."""
    import resource

    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With CVAE_CPU_PROFILE=FILE, appends each test's CPU-seconds (its setup, call and
    teardown, subprocesses included) to FILE: unlike wall time, CPU time hardly changes with
    the machine's load, so it ranks the suite's costs on a busy machine too (`make
    test-profile`)."""
    target = os.environ.get("CVAE_CPU_PROFILE")
    if not target:
        return (yield)
    start = _cpu_seconds()
    try:
        return (yield)
    finally:
        with open(target, "a") as out:
            out.write(f"{_cpu_seconds() - start:.2f}\t{item.nodeid}\n")
