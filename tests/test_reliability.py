"""Training survives kills, signals and a full disk without losing work."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from trees import tree_equal

from conftest import shared_directory
from cvae.training.checkpoints import load_checkpoint

pytestmark = pytest.mark.slow  # `make test-slow`, not `make test` (docs/development.md)

# 16 steps/epoch, 96 steps in all.
TRAIN_FLAGS = ["--train-limit", 256, "--validation-size", 64, "--batch-size", 16, "--epochs", 6,
               "--hidden-sizes", "32", "--latent-dim", 4, "--warmup-steps", 0,
               "--steps-per-call", 4, "--eval-batch-size", 64, "--eval-every", 1,
               "--no-progress"]


def train_command(data_dir, checkpoint_dir, *extra):
    return [sys.executable, "-m", "cvae.cli", "train", "--data-dir", str(data_dir),
            "--checkpoint-dir", str(checkpoint_dir), *map(str, TRAIN_FLAGS), *extra]


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """An uninterrupted run of the same command (once a session, shared by the xdist workers)."""
    def build(checkpoint_dir):
        result = subprocess.run(train_command(data_dir, checkpoint_dir), capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
    return load_checkpoint(shared_directory(tmp_path_factory, "reliability-reference", build))


def entries(directory):
    return set(os.listdir(directory)) if directory.exists() else set()


def kill_repeatedly(command, directory, seed: int, max_kills: int = 4,
                    budget_seconds: float = 240, ignored=("metrics.jsonl",)) -> int:
    """Start `command` up to `max_kills` times, SIGKILLing it each time at a seeded random
    moment soon after it writes something new in `directory` (an entry not in `ignored`).
    Returns how many kills landed."""
    rng = random.Random(seed)
    kills = 0
    deadline = time.monotonic() + budget_seconds
    while kills < max_kills and time.monotonic() < deadline:
        before = entries(directory)
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while process.poll() is None and not entries(directory) - before - set(ignored):
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        if process.poll() is not None:
            break  # finished before the kill
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
    return kills


@pytest.mark.determinism
def test_sigkill_at_random_moments_then_resume_gives_identical_parameters(data_dir, reference,
                                                                          tmp_path):
    """3 SIGKILLs, each at a seeded random moment soon after the run writes something new in
    its checkpoint directory, so that kills land inside saves and between steps."""
    kills = kill_repeatedly(train_command(data_dir, tmp_path), tmp_path, seed=1234, max_kills=3)
    result = subprocess.run(train_command(data_dir, tmp_path), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert kills >= 3, "the run finished before it could be killed enough times"
    final = load_checkpoint(tmp_path)
    assert final.step == reference.step == 96
    assert tree_equal(final.state.params, reference.state.params)
    assert tree_equal(final.state.opt_state, reference.state.opt_state)


def stop_by_signal(command, directory, signum, after_lines: int) -> int:
    """Start `command`, send `signum` once metrics.jsonl has more than `after_lines` lines (an
    epoch done since then), check the one stop line and exit 0; returns the saved step."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = directory / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) > after_lines
               ) and time.monotonic() < deadline:
        time.sleep(0.1)  # wait until training is under way (an epoch done)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-2000:]
    message = [line for line in stderr.splitlines() if "stopped at step" in line]
    assert len(message) == 1 and f"interrupted by {signal.Signals(signum).name}" in message[0]
    assert "resume with the same command" in message[0]
    return load_checkpoint(directory).step


def test_signal_finishes_the_chunk_saves_and_exits_zero(data_dir, reference, tmp_path):
    """SIGTERM, then SIGINT to the run that resumed from it (one run for both signals: each
    stops it between chunks, saves and exits 0); the last resume ends on the reference."""
    command = train_command(data_dir, tmp_path)
    first = stop_by_signal(command, tmp_path, signal.SIGTERM, after_lines=0)
    assert 16 <= first < 96 and first % 4 == 0
    lines = len((tmp_path / "metrics.jsonl").read_text().splitlines())
    second = stop_by_signal(command, tmp_path, signal.SIGINT, after_lines=lines)
    assert first < second < 96 and second % 4 == 0
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert tree_equal(load_checkpoint(tmp_path).state.params, reference.state.params)


def test_unwritable_checkpoint_dir_fails_before_training(data_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    started = time.monotonic()
    result = subprocess.run(train_command(data_dir, blocker / "ck"), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "checkpoint dir" in result.stderr and "not writable" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 30  # no training happened (loose: a slow CI machine)


def test_a_second_run_on_a_live_directory_is_refused_and_changes_nothing(data_dir, reference,
                                                                         tmp_path):
    """The first run, paused mid-training (SIGSTOP), still holds its directory: a second
    `cvae train --fresh` there exits 2 naming it and moves nothing; the first then ends as
    an uninterrupted run does, and a later command there is no longer refused."""
    command = train_command(data_dir, tmp_path)
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as first:
        metrics, deadline = tmp_path / "metrics.jsonl", time.monotonic() + 120
        while not metrics.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        first.send_signal(signal.SIGSTOP)
        try:
            before = entries(tmp_path)
            second = subprocess.run([*command, "--fresh"], capture_output=True, text=True,
                                    timeout=120)
            after = entries(tmp_path)
        finally:  # a stopped process would never exit: Popen's exit would wait on it forever
            first.send_signal(signal.SIGCONT)
        try:
            _, first_errors = first.communicate(timeout=300)
        finally:
            first.kill()
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"cvae train: error: {tmp_path} is being written by another cvae train (pid "
        f"{first.pid} on {socket.gethostname()}); wait for it to end or stop it, or pass "
        "another --checkpoint-dir"]
    assert after == before  # --fresh moved nothing aside
    assert first.returncode == 0, first_errors[-2000:]
    assert tree_equal(load_checkpoint(tmp_path).state.params, reference.state.params)
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr[-2000:]


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 1200 KiB tmpfs: room for one tiny checkpoint, not two. Needs mount rights (root)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); needs root")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=False)


def test_disk_full_during_save_says_so_and_keeps_the_previous_checkpoint(data_dir,
                                                                         tiny_filesystem):
    checkpoint_dir = tiny_filesystem / "ck"
    result = subprocess.run(train_command(data_dir, checkpoint_dir), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    # Orbax's writer threads may still be printing their own traceback as the process exits,
    # so our line can land after a fragment of theirs: found within a line, not at its start.
    ours = [line for line in result.stderr.splitlines() if "cvae train: error" in line]
    assert len(ours) == 1 and "disk full while saving step 32" in ours[0], result.stderr[-3000:]
    assert "previous checkpoint (step 16) is intact" in ours[0]
    assert load_checkpoint(checkpoint_dir).step == 16
    assert not list(checkpoint_dir.glob("*orbax-checkpoint-tmp*"))  # the partial save is gone


# Two epochs (32 steps): room for a kill after the first save and a resume from it. The KL
# warm-up (linear over 6 steps) puts the step's KL weight in what a resume must restore.
LEVER_FLAGS = ["--model", "ladder", "--stochastic-layers", "2", "--upper-latent-dim", "2",
               "--objective", "dreg", "--importance-samples", "3", "--prior", "learned_mixture",
               "--prior-components", "3", "--epochs", "2", "--kl-schedule", "linear",
               "--kl-warmup-steps", "6"]


@pytest.mark.determinism
def test_a_model_lever_run_resumes_exactly_after_sigkill(data_dir, tmp_path):
    """The model levers keep exact resume, all at once: a two-layer ladder trained with DReG
    (K = 3) under a learned mixture prior, its KL warmed up (the noise from the step's key, the
    prior in the params and written into the state, over the top layer's codes). (This is also
    the ladder's `cvae train` with DReG and a learned prior resuming exactly, which
    tests/test_ladder.py checked on a run of its own.)"""
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    result = subprocess.run(train_command(data_dir, reference_dir, *LEVER_FLAGS),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # Not killed as TensorBoard's folder appears, before the first step: the first kill lands
    # once the first save has begun, so the next start can resume from a saved step.
    kills = kill_repeatedly(train_command(data_dir, killed_dir, *LEVER_FLAGS), killed_dir,
                            seed=26, max_kills=2, ignored=("metrics.jsonl", "tensorboard"))
    result = subprocess.run(train_command(data_dir, killed_dir, *LEVER_FLAGS),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert kills >= 1
    reference, final = load_checkpoint(reference_dir), load_checkpoint(killed_dir)
    assert final.step == reference.step == 32
    assert tree_equal(final.state.params, reference.state.params)
    assert tree_equal(final.state.opt_state, reference.state.opt_state)
    # The learned prior, written where the fitted one is: a mixture over the top layer (2 wide).
    assert final.state.prior["mixture"]["means"].shape == (10, 3, 2)
    assert tree_equal(final.state.prior, reference.state.prior)
    rows = [json.loads(line) for line in (killed_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(row["validation_loss"]) for row in rows if "validation_loss" in row)
    assert any("validation_loss" in row for row in rows)
