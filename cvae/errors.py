"""The exceptions that mean "the user asked for something impossible", not "there is a bug".

The CLI prints these as one line and exits non-zero; anything else keeps its traceback.
"""

from cvae.checkpoint import CheckpointError
from cvae.config import ConfigError
from cvae.data import DataError
from cvae.loop import ResumeError

USER_ERRORS = (ConfigError, DataError, CheckpointError, ResumeError, PermissionError)
