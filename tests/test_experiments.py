"""experiments/ cannot rot unseen: every config's stages parse into a valid `Config` through
`cvae train`'s own flags, its baseline exists, its eval flags are `cvae eval`'s, and its
docstring gives the command that reruns it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from cvae.cli import main as cli
from cvae.config import sections as config_lib
from cvae.data import specs
from experiments import run
from experiments.configs import names

NAMES = names()


def test_there_are_experiments():
    assert "default" in NAMES and len(NAMES) >= 5


def own_data_stand_in(name: str) -> specs.DatasetSpec:
    """A data set of one's own that a config names, registered for the parse alone: it is
    prepared where the experiment runs (its docstring says how)."""
    return specs.DatasetSpec(name, name, name, 64, 64, 3, tuple(map(str, range(10))), None)


@pytest.mark.parametrize("name", NAMES)
def test_config_parses_through_the_cli_and_names_its_rerun(name, monkeypatch):
    experiment = importlib.import_module(f"experiments.configs.{name}")
    parser = cli.build_parser()
    for flags in experiment.STAGES:
        for flag, value in zip(flags, flags[1:]):
            if flag == "--dataset" and value not in specs.SPECS:
                monkeypatch.setitem(specs._REGISTERED, value, own_data_stand_in(value))
        args = parser.parse_args(["train", *flags])
        assert isinstance(cli.config_from_args(args), config_lib.Config)
    parser.parse_args(["eval", *experiment.EVAL])
    assert experiment.BASELINE is None or experiment.BASELINE in NAMES
    assert experiment.DEVICE in ("cpu", "gpu") and experiment.BUDGET_MINUTES > 0
    assert experiment.SEEDS and f"python -m experiments.run {name}" in experiment.__doc__


def test_dry_run_chains_the_stages(capsys):
    assert run.main(["likelihood", "--seeds", "0", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["train", "train", "eval"]
    stage_1 = str(Path("experiment-runs/likelihood/seed-0/stage-1/checkpoints"))
    assert f"--init-from {stage_1}" in lines[1]
