"""How large a data set may be: training holds it in memory, so one that does not fit is refused
before any work, never killed for memory in the middle of training.

A data set takes images x height x width x channels bytes (uint8). Training holds that about
three times while it starts (the loaded arrays, the training/validation split's copies, and the
device's copy, which on a CPU is host memory too), beside the model, its optimizer and the
batches. So a data set may take at most `MEMORY_SHARE` of the machine's memory: a quarter, 4 GiB
of a 16 GiB machine (about 5 million 28x28 grey images, or 1.3 million 32x32 colour ones).
The machine's memory is the smaller of its physical memory and its cgroup's limit (a
container's), or what `$CVAE_MEMORY_BYTES` says, to budget a machine shared with other work.
`cvae data` checks before it writes, `cvae train` and `cvae eval` before they load. No JAX here.
"""

from __future__ import annotations

import os
from pathlib import Path

from cvae.errors import DataError

MEMORY_SHARE = 0.25  # of the machine's memory, for the data set's uint8 arrays
MEMORY_ENV = "CVAE_MEMORY_BYTES"  # the memory to budget for, in bytes, instead of the machine's
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
                  Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))  # cgroup v1


def machine_memory() -> int:
    """Bytes of memory this process may use: $CVAE_MEMORY_BYTES when set, else physical
    memory or its cgroup's lower limit."""
    budget = os.environ.get(MEMORY_ENV, "")
    if budget:
        if not budget.isdigit():
            raise DataError(f"${MEMORY_ENV}={budget!r}: must be a number of bytes")
        return int(budget)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = [physical]
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits)


def data_limit(memory: int | None = None) -> int:
    """The most bytes a data set may take, on a machine of `memory` bytes (default this one)."""
    return int(MEMORY_SHARE * (machine_memory() if memory is None else memory))


def check_fits(size: int, *, where: str, memory: int | None = None) -> None:
    """DataError unless a data set of `size` bytes (images x pixels x channels) fits."""
    limit = data_limit(memory)
    if size > limit:
        raise DataError(f"{where}: {_bytes(size)} of images is more than this machine can "
                        f"train on ({_bytes(limit)}, {MEMORY_SHARE:.0%} of its memory); use "
                        f"fewer or smaller images (--image-size)")


def _bytes(size: int) -> str:
    """1001 -> "1001 B"; 5 * 2**30 -> "5.0 GiB"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
