"""What made a run, written into every checkpoint step beside Orbax's items: `config.toml` (the
effective config, a file `cvae train --config` reads) and `record.json` (the run record).

The record: the command line; the versions of Python, cvae, jax, jaxlib, flax, optax and
orbax-checkpoint; the devices and the CPU model; the git commit of the code and whether its tree
was dirty (null outside a git tree); the dataset's manifest hash; when this invocation started
and when the step was saved (`ended_at`). Process 0 writes both files after each save (the
step is already committed then), so a run of several processes writes them once. `cvae eval`
and `cvae export` read the record back (`cvae.model.store.read_record`); steps written before
records have none.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import jax

from cvae.config.sections import Config
from cvae.config.toml import to_toml
from cvae.model.store import CONFIG_FILE, RECORD_FILE
from cvae.data.specs import spec_of

PACKAGES = ("cvae", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
GIT_TIMEOUT_SECONDS = 5  # a hung git (a network file system, a lock) must not stall training
SOURCE_DIR = Path(__file__).resolve().parents[1]  # the cvae package: its git tree is the code's


def now() -> str:
    """The time as ISO 8601 in UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def create_record(config: Config, command: list[str], *, started_at: str) -> dict[str, Any]:
    """Everything of the record but the save time (`write_step_files` adds it)."""
    return {"command": list(command), "versions": versions(), "devices": devices(),
            "cpu": cpu_name(), "git": git_state(SOURCE_DIR),
            "dataset": {"name": config.data.dataset, "manifest_sha256": dataset_hash(config)},
            "started_at": started_at}


def versions() -> dict[str, str | None]:
    """Python's version and each of `PACKAGES`' installed version (None where absent)."""
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def devices() -> list[dict[str, Any]]:
    """Every device of every process the run spans."""
    return [{"id": device.id, "platform": device.platform, "kind": device.device_kind,
             "process": device.process_index} for device in jax.devices()]


def cpu_name() -> str:
    """This machine's CPU model (its name where Linux says it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_state(directory: Path) -> dict[str, Any] | None:
    """{"commit", "dirty"} of the git tree holding `directory`; None without git or a tree."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                              text=True, check=True, timeout=GIT_TIMEOUT_SECONDS).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def dataset_hash(config: Config) -> str | None:
    """The dataset's manifest hash: a prepared dataset's own, else the sha256 its offline
    source is checked against, else None."""
    spec = spec_of(config.data.dataset)
    return spec.content_hash or (spec.source.sha256 if spec.source else "") or None


def write_step_files(step_dir: Path, config: Config, record: dict[str, Any]) -> None:
    """`config.toml` and `record.json` into a committed step's folder; the record's `ended_at`
    is now, when the step was saved."""
    step_dir.joinpath(CONFIG_FILE).write_text(to_toml(config, header=(
        f"The config of {' '.join(record['command'])}, saved at this step.")))
    step_dir.joinpath(RECORD_FILE).write_text(
        json.dumps({**record, "ended_at": now()}, indent=2, sort_keys=True) + "\n")

