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


def cache_entries() -> set[Path]:
    """The cache's entries for jitted lambdas (each file is named after its program)."""
    return set(Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).glob("jit__lambda-*-cache"))


def test_a_torn_cache_entry_is_compiled_again_with_the_same_result():
    offset = float(secrets.randbelow(2**20))  # a program no other test compiles: its own entry
    before = cache_entries()
    first = jax.jit(lambda x: x * 2 + offset)(jnp.float32(3))
    (entry,) = cache_entries() - before
    written = entry.read_bytes()
    entry.write_bytes(written[:len(written) // 2])  # as a reader sees it while it is written
    # A new function of the same program: not in this process's memory, so read from the cache.
    second = jax.jit(lambda x: x * 2 + offset)(jnp.float32(3))
    assert float(first) == float(second) == 6 + offset
