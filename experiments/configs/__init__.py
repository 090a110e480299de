"""One module per experiment. Each defines:

- STAGES: the `cvae train` flags of each stage; a later stage starts from the weights of the
  one before it (`--init-from`, added by the runner).
- EVAL: the `cvae eval` flags it was scored with.
- BASELINE: the experiment it is compared with (trained in the same budget), or None.
- BUDGET_MINUTES: the wall-clock budget of one run (all stages); a run still going then is
  stopped and keeps the step it reached.
- SEEDS: the training seeds measured.
- DEVICE: "cpu" (2 cores) or "gpu" (one GPU), the machine it was measured on.

Its docstring gives the command that reruns it and the result measured.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path


def names() -> list[str]:
    """Every experiment's name, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                  if not m.name.startswith("_"))
