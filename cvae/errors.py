"""The exceptions that mean "the user asked for something impossible", not "there is a bug".

The CLI prints these as one line and exits non-zero; anything else keeps its traceback. This
module imports nothing but `sys`, so the CLI can catch them without loading JAX or Orbax.
"""

import sys


class ConfigError(ValueError):
    """A config value is out of range; the message names the field and what is allowed."""


class DataError(Exception):
    """Data is missing or malformed; the message is one line naming the file and the problem."""


class CheckpointError(RuntimeError):
    """No usable checkpoint; the message says where we looked and what to do."""


class StepNotFound(CheckpointError):
    """`--step N` names a step the directory does not hold; the message lists those it does."""

    def __init__(self, directory, step: int, steps):
        there = ", ".join(map(str, sorted(steps))) or "none"
        super().__init__(f"no step {step} in {directory} (steps there: {there})")


class ResumeError(RuntimeError):
    """The checkpoint directory holds a run that the requested config cannot continue."""


class RunInProgress(RuntimeError):
    """Another live `cvae train` holds the checkpoint directory (cvae/training/run_lock.py)."""


class ExportError(RuntimeError):
    """`cvae export` cannot write where it was asked to (the folder is not empty, say)."""


USER_ERRORS = (ConfigError, DataError, CheckpointError, ResumeError, PermissionError,
               ExportError, RunInProgress)


def weights_mismatch(error: BaseException) -> str | None:
    """What to tell the user when `error` is Flax's `ScopeParamShapeError`: a checkpoint whose
    weights have other shapes than its config's model makes (inference takes the shapes the
    checkpoint stored, so it is found where the model first applies them); else None. Without
    importing Flax: where it was never imported, no error of its can have been raised."""
    flax_errors = sys.modules.get("flax.errors")
    if flax_errors is None or not isinstance(error, flax_errors.ScopeParamShapeError):
        return None
    reason = str(error).split(" (https://")[0]  # Flax's message, less its link
    return f"the weights do not have the shapes that its config's model makes: {reason}"
