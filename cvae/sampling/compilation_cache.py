"""JAX's persistent compilation cache, for the commands that load a model to draw from it.

A process that serves or samples compiles a few programs before its first answer (a decode
block, the latent draw, the grid's), 0.5 to 2 s each on a 2-core CPU. JAX can keep compiled
programs on disk, keyed by the program, the compile options and XLA flags, the jax version and
the backend, so the next process on the machine reads them instead (`cvae serve`, `cvae sample`
and `cvae export` turn it on). XLA:CPU refuses an entry compiled for CPU features the host lacks
and compiles the program again, so a cache copied to another machine is safe, only useless.

Synopsis:

    directory = enable(cache_directory(None))   # before the first compile of the process
    with counted() as count:                    # programs read from the cache, and compiled
        sampler = open_sampler(...)
    count.hits, count.misses

Standard library only until `enable` runs, so the command line can resolve the directory
without loading JAX (`cvae serve`'s master process never does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "CVAE_COMPILATION_CACHE"  # a directory, or "off"
OFF = "off"
# JAX's own setting (its environment variable, read when JAX loads): where it is set, as the
# test suite sets it, that cache is used as JAX was told.
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
# Least recently used entries go beyond this (JAX's LRU cache, which then locks its directory:
# workers starting together write one entry at a time). A served model's programs take a few MB.
MAX_BYTES = 1 << 30
HITS, MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"


def cache_directory(choice: str | None) -> Path | None:
    """`--compilation-cache`'s value (None: not given) -> the directory, or None for off: the
    flag, else $CVAE_COMPILATION_CACHE, else JAX's own $JAX_COMPILATION_CACHE_DIR (the test
    suite's), else $XDG_CACHE_HOME/cvae/xla (~/.cache/cvae/xla)."""
    choice = choice or os.environ.get(ENV) or os.environ.get(JAX_ENV)
    if choice == OFF:
        return None
    if choice:
        return Path(choice).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cvae" / "xla"


def enable(directory: Path | None) -> Path | None:
    """Compile through the cache in `directory` from now on (None: compile everything); returns
    `directory`, or None where it cannot be written (a warning says so: the process still
    works, only compiles more). Call it before the process compiles anything: JAX opens its
    cache at the first compile."""
    import jax

    if directory is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:  # a home that does not exist, a read-only file system
        log.warning("compilation cache %s is not writable (%s): compiling every program; "
                    "--compilation-cache DIR names another", directory,
                    error.strerror or error)
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    for name, value in CACHE_SETTINGS.items():
        jax.config.update(name.lower(), value)
    if directory != Path(os.environ.get(JAX_ENV) or "."):  # a cache JAX was given stays as is
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return directory


# Every program, however fast it compiles (each is small), and keys that do not depend on the
# cache's path: by default JAX writes the directory of XLA's GPU autotuning cache, inside the
# cache, into every program's compile options, so a cache moved or carried elsewhere (an
# export's) would never hit. As environment variables for processes started with a cache.
CACHE_SETTINGS = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": 0.0,
                  "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": 0,
                  "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}


@dataclasses.dataclass
class CacheCount:
    hits: int = 0  # programs read from the cache
    misses: int = 0  # programs compiled (and written to it)


_counts: list[CacheCount] = []
_lock = threading.Lock()


def _listen(event: str, **_metadata) -> None:
    if event in (HITS, MISSES):
        with _lock:
            for count in _counts:
                if event == HITS:
                    count.hits += 1
                else:
                    count.misses += 1


_listening = False


@contextlib.contextmanager
def counted():
    """Count the programs read from the cache and compiled, in every thread, while inside."""
    global _listening
    import jax

    with _lock:
        if not _listening:
            jax.monitoring.register_event_listener(_listen)
            _listening = True
        count = CacheCount()
        _counts.append(count)
    try:
        yield count
    finally:
        with _lock:
            _counts.remove(count)
