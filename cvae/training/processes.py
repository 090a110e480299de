"""One of N processes on JAX's distributed runtime: joining it, who writes, agreeing to stop.

`cvae train` calls `initialize` before JAX touches a device. With explicit flags
(`--coordinator-address`, `--num-processes`, `--process-id`) those are used; without them JAX's
own cluster detection decides (SLURM, Open MPI's `mpirun`, Kubernetes indexed Jobs with the
`kubernetes` package, Cloud TPU), and where it finds no cluster the run is a plain single
process. Afterwards `jax.devices()` spans every process, so the one mesh of `cvae.training.devices`
covers them all. Process 0 is the only writer of logs and pictures; Orbax checkpoints are
written collectively. Every process must run the same sequence of device programs, so
decisions taken on one process alone (a signal) are agreed on by all before anyone acts.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import numpy as np

from cvae.errors import ConfigError
from cvae.training.launch import DEFAULT_HEARTBEAT_TIMEOUT

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Where this process stands: `index` of `count` processes (0 of 1 when not distributed)."""

    index: int = 0
    count: int = 1

    @property
    def is_writer(self) -> bool:
        """Process 0 writes logs, TensorBoard, pictures and moves folders; nobody else does."""
        return self.index == 0

    def describe(self) -> str:
        return f"process {self.index} of {self.count}"


def current() -> ProcessGroup:
    return ProcessGroup(jax.process_index(), jax.process_count())


def parse_address(address: str) -> str:
    """`HOST:PORT`, checked here so a typo is one line and not a gRPC failure a minute later."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"coordinator_address={address!r}: must be HOST:PORT with a port in "
                          f"1..65535, e.g. 10.0.0.1:1234")
    return address


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None,
               *, heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT) -> ProcessGroup:
    """Join the distributed runtime when asked to or when JAX detects a cluster.

    Must run before anything initialises a JAX backend. `num_processes=1` forces a plain single
    process (no detection). Gloo carries the CPU backend's collectives between processes; GPUs
    use NCCL whatever this setting says.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    explicit = (coordinator_address, num_processes, process_id)
    if num_processes == 1:
        return ProcessGroup()
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ConfigError(f"process_id={process_id}: must be in 0..{num_processes - 1} "
                          f"for --num-processes {num_processes}")
    if coordinator_address is not None:
        parse_address(coordinator_address)
    timeouts = dict(heartbeat_timeout_seconds=heartbeat_timeout,
                    shutdown_timeout_seconds=heartbeat_timeout)
    if any(value is not None for value in explicit):
        try:
            jax.distributed.initialize(coordinator_address, num_processes, process_id, **timeouts)
        except ValueError as error:  # a value missing that no detected cluster could supply
            raise ConfigError(f"distributed training: {error} (pass --coordinator-address, "
                              f"--num-processes and --process-id together)") from None
    else:
        try:
            jax.distributed.initialize(**timeouts)
        except ValueError as error:
            # JAX raises exactly this when no cluster environment was detected and nothing was
            # given: a plain single-process run. Anything else is a real problem.
            if "coordinator_address should be defined" not in str(error):
                raise
            return ProcessGroup()
    group = current()
    log.info("joined the distributed runtime as %s", group.describe())
    return group


def barrier(name: str) -> None:
    """Wait until every process gets here (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
    """True on every process when `flag` is true on at least one (a collective: all must call)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag, np.int32))))


def from_process_zero(value: float) -> float:
    """Process 0's `value` on every process (a collective: all must call): a figure measured on
    each, such as the machine's speed, that must not make their choices differ."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return float(multihost_utils.broadcast_one_to_all(np.asarray(value, np.float32)))


def local_copy(tree):
    """This process's own copy of fully replicated arrays, on its first local device.

    Work that only the writer does (sample grids) must not run a program over the global mesh,
    which would wait for processes that never call it.
    """
    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, tree)
