"""Model experiments: one config per experiment (experiments/configs/), each run through the
normal `cvae train` and `cvae eval` commands by `python -m experiments.run NAME`. Not part of
the installed package; LOG.md is the dated record of what was tried."""
