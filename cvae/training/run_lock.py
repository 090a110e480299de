"""One live `cvae train` per checkpoint directory.

Two runs writing one directory would interleave their steps, and each would delete the other's
checkpoints as it keeps its own last few. The kernel's advisory lock (`flock`) on a file in the
directory refuses the second run; the kernel releases it when the holder's process ends, however
it ends, so a killed run leaves nothing to clean up. Only a multi-process run's writer takes it,
since its other processes write the same directory by design.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from cvae.errors import RunInProgress

LOCK_NAME = ".train.lock"


@contextlib.contextmanager
def held(directory: Path) -> Iterator[None]:
    """Lock `directory` for this process while the block runs.

    On a file system without `flock` the run goes on unguarded, as it did before the lock.
    """
    with open(directory / LOCK_NAME, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunInProgress(f"{directory} is being written by another cvae train ({holder}); "
                                "wait for it to end or stop it, or pass another "
                                "--checkpoint-dir") from None
        except OSError:
            pass
        else:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
        yield
