"""Jitted forms of what tests call many times on tiny shapes. Run eagerly, each operation of a
model's pass is compiled on its own (hundreds of small programs a file); one jitted pass is one
program per model, method and shape."""

from __future__ import annotations

import functools

import jax


@functools.partial(jax.jit, static_argnames=("model", "method"))
def apply(model, variables, *args, method):
    """`model.apply(variables, *args, method=method)`, jitted (the model and method static)."""
    return model.apply(variables, *args, method=method)
