"""The suite's shared persistent compilation cache (tests/conftest.py) under a torn entry.

JAX writes an unbounded cache's entries without a lock, so one test process can read an entry
that another is still writing. pyproject.toml's warning filter lets JAX compile the program
again, as it does outside the suite, instead of failing the test that happened to read it.
"""

import os
import secrets
from pathlib import Path

import jax
import jax.numpy as jnp


def jitted_probe(offset: float):
    """A new function object each call, all named alike: a second one is not in this process's
    memory, so its program is read from the cache. The name is this test's alone, so the other
    xdist worker writes no entry that the glob below would find."""
    def torn_entry_probe(x):
        return x * 2 + offset

    return jax.jit(torn_entry_probe)


def probe_entries() -> set[Path]:
    """The cache's entries for `jitted_probe`'s programs (each file is named after its program)."""
    return set(Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).glob("jit_torn_entry_probe-*-cache"))


def test_a_torn_cache_entry_is_compiled_again_with_the_same_result():
    offset = float(secrets.randbelow(2**20))  # a new program, even in a cache kept from before
    before = probe_entries()
    first = jitted_probe(offset)(jnp.float32(3))
    (entry,) = probe_entries() - before
    written = entry.read_bytes()
    entry.write_bytes(written[:len(written) // 2])  # as a reader sees it while it is written
    second = jitted_probe(offset)(jnp.float32(3))
    assert float(first) == float(second) == 6 + offset
