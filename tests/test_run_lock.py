"""One live `cvae train` per checkpoint directory (cvae/training/run_lock.py)."""

import os
import subprocess
import sys

import pytest

from cvae.errors import RunInProgress
from cvae.training import run_lock


def test_a_held_directory_is_refused_naming_its_holder_until_released(tmp_path):
    with run_lock.held(tmp_path):
        with pytest.raises(RunInProgress, match=f"another cvae train \\(pid {os.getpid()} on "):
            with run_lock.held(tmp_path):
                pass
    with run_lock.held(tmp_path):
        pass


HOLD = """import sys
from pathlib import Path
from cvae.training import run_lock
with run_lock.held(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_the_lock_goes_when_its_process_dies_without_closing_it(tmp_path):
    """A SIGKILLed run releases it: the kernel drops a dead process's locks."""
    with subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunInProgress, match=f"pid {holder.pid} "):
            with run_lock.held(tmp_path):
                pass
        holder.kill()
    with run_lock.held(tmp_path):
        pass
