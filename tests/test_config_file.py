"""Config files (cvae/config/toml.py), the grouped `cvae train --help` and the run record
(cvae/training/record.py): in process, on the test preset, one tiny run trained both ways."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import struct
import tomllib
from pathlib import Path

import jax
import numpy as np
import pytest

from cvae.cli.main import build_parser, main
from cvae.config import flat, presets
from cvae.config.sections import Config
from cvae.data.specs import spec_of
from cvae.config.toml import load_config, preset_file, to_toml
from cvae.model.store import CONFIG_FILE, RECORD_FILE, read_record
from cvae.training.checkpoints import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints-before-stages"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def train_parser():
    return build_parser()._subparsers._group_actions[0].choices["train"]


def test_every_setting_has_exactly_one_flag_and_one_group():
    """The groups are derived from the config's nesting: a section's settings in its group, a
    component's options in a group that names the components that have them."""
    groups_of: dict[str, list[str]] = {}
    for group in train_parser()._action_groups:
        for action in group._group_actions:
            for flag in action.option_strings:
                groups_of.setdefault(flag, []).append(group.title)
    leaves, names = flat.all_leaves(Config), flat.flat_names(Config)
    assert sorted(names.values()) == sorted(leaves)  # one flat name, so one flag, a setting
    assert len(set(names.values())) == len(names)
    for name, path in names.items():
        titles = groups_of.get("--" + name.replace("_", "-"), [])
        assert len(titles) == 1, (path, titles)
        section, leaf = path.split(".")[0], leaves[path]
        assert titles[0].split(" ")[0] == section, (path, titles)
        if leaf.components:
            assert titles[0] == f"{section} options ({', '.join(leaf.components)})", path
        else:
            assert titles[0] == section, path


@pytest.mark.parametrize("name", presets.PRESETS)
def test_each_shipped_config_file_is_its_preset(name):
    """configs/NAME.toml (`make configs`) loads to the preset's config, field for field."""
    path = ROOT / "configs" / f"{name}.toml"
    assert load_config(None, path, {}) == presets.get_preset(name)
    assert path.read_text() == preset_file(name), "configs/ is stale: run `make configs`"


def test_floats_print_and_parse_back_to_the_same_bits(tmp_path):
    awkward = presets.test().replace(learning_rate=0.1 + 0.2, end_learning_rate=1e-7 / 3,
                                     kl_weight=1e300, free_bits=5e-324, momentum=2 / 3)
    loaded = load_config("test", write(tmp_path / "a.toml", to_toml(awkward)), {})
    assert loaded == awkward
    for path in ("optimizer.learning_rate", "optimizer.end_learning_rate",
                 "objective.kl_weight", "objective.free_bits", "optimizer.momentum"):
        assert bits(loaded.leaves()[path]) == bits(awkward.leaves()[path]), path


def test_preset_then_file_then_flags(tmp_path):
    path = write(tmp_path / "run.toml", 'preset = "semi"\n[run]\nepochs = 3\n'
                                        '[model.options]\nhidden_sizes = [64, 32]\n')
    assert load_config(None, path, {}) == presets.semi().replace(epochs=3, hidden_sizes=(64, 32))
    assert load_config(None, path, {"epochs": 7}).run.epochs == 7  # a flag overrides the file
    # --preset overrides the file's preset; the file's fields still apply over it.
    assert load_config("seed", path, {}) == presets.seed().replace(epochs=3,
                                                                   hidden_sizes=(64, 32))


@pytest.mark.parametrize("text, message", [
    ("[run]\nbatch_sise = 1\n", "unknown key 'run.batch_sise'"),
    ("batch_sise = 1\n", "unknown key 'batch_sise'"),  # a flat file of earlier versions
    ('[run]\nbatch_size = "16"\n', "run.batch_size='16': must be an integer"),
    ("[model.options]\nbatch_norm = 1\n",
     "model.options.batch_norm=1: must be true or false"),
    ("[model.options]\nhidden_sizes = [64, 1.5]\n",
     "model.options.hidden_sizes=[64, 1.5]: must be a list of integers"),
    ("[optimizer]\nlearning_rate = true\n", "optimizer.learning_rate=True: must be a number"),
    ("[run]\nbatch_size = 0\n", "run.batch_size=0: must be >= 1"),
    ('preset = "best"\n', "preset='best': allowed default, seed"),
    ("batch_size =\n", "not valid TOML"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, message):
    path = write(tmp_path / "bad.toml", text)
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"cvae train: error: {path}: ") and message in captured.err
    assert captured.err.count("\n") == 1


def test_a_missing_file_is_refused(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "none.toml")]) == 2
    assert "none.toml: cannot read the config file" in capsys.readouterr().err


def test_print_config_prints_every_field_of_the_effective_config(capsys):
    assert main(["train", "--preset", "semi", "--epochs", "2", "--print-config"]) == 0
    values = tomllib.loads(capsys.readouterr().out)
    assert set(values) == {f.name for f in dataclasses.fields(Config)}
    assert set(flat.leaves(values)) == set(presets.semi().leaves())
    assert values["run"]["epochs"] == 2 and values["labels"]["count"] == "100"


def train_help(capsys, *flags: str) -> str:
    with pytest.raises(SystemExit):
        main(["train", *flags, "--help"])
    return capsys.readouterr().out


def flag_help(text: str, flag: str) -> str:
    """The help of `flag` in `cvae train --help`'s text, on one line."""
    return " ".join(re.search(rf"^  {flag} \S+\s+(.*?)^  -", text, flags=re.S | re.M)[1].split())


def test_help_groups_the_flags_and_shows_the_presets_values(capsys):
    default, semi = train_help(capsys), train_help(capsys, "--preset", "semi")
    titles = [line[:-1] for line in default.splitlines() if line.endswith(":")]
    sections = [f.name for f in dataclasses.fields(Config)]
    assert [t for t in titles if t in sections] == sections  # in the config's order
    assert len(default.split("usage:")[1].split("\n\n")[0].splitlines()) == 1  # a short usage
    assert flag_help(default, "--labels").endswith("(default all)")
    assert flag_help(semi, "--labels").endswith("(default 100)")
    assert flag_help(semi, "--epochs").endswith("(default 15)")
    assert "--coordinator-address" in default.split("\nprocesses:")[1]


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory, data_dir):
    """`--preset test` and `--config` of its printed file, 4 steps each into their own folder."""
    root = tmp_path_factory.mktemp("both-ways")
    printed = root / "s.toml"
    with open(printed, "w") as out, contextlib.redirect_stdout(out):
        assert main(["train", "--preset", "test", "--max-steps", "4", "--print-config"]) == 0
    for name, source in (("preset", ["--preset", "test", "--max-steps", "4"]),
                         ("file", ["--config", str(printed)])):
        assert main(["train", *source, "--data-dir", str(data_dir), "--checkpoint-dir",
                     str(root / name), "--no-progress", "--num-processes", "1"]) == 0
    return root


def test_a_printed_config_trains_the_same_run_to_the_bit(both_ways):
    preset, from_file = (load_checkpoint(both_ways / name) for name in ("preset", "file"))
    assert preset.step == from_file.step == 4
    assert preset.config == from_file.config
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                        preset.state.params, from_file.state.params)
    assert all(jax.tree.leaves(same))


def test_each_step_holds_its_config_and_its_record(both_ways):
    step_dir = both_ways / "file" / "4"
    stored = load_checkpoint(both_ways / "file").config
    assert load_config(None, step_dir / CONFIG_FILE, {}) == stored  # a file --config reads
    record = json.loads((step_dir / RECORD_FILE).read_text())
    assert record == read_record(both_ways / "file", 4)
    assert record["command"][:3] == ["cvae", "train", "--config"]
    assert record["versions"]["jax"] == jax.__version__ and record["versions"]["python"]
    assert {"orbax-checkpoint", "flax", "optax", "jaxlib"} <= set(record["versions"])
    assert len(record["devices"]) == jax.device_count() and record["cpu"]
    assert record["git"] is None or len(record["git"]["commit"]) == 40
    assert record["dataset"]["manifest_sha256"] == spec_of(stored.data.dataset).source.sha256
    assert record["started_at"] <= record["ended_at"]


def test_steps_saved_before_records_have_none():
    assert read_record(FIXTURES / "few-labels", 5) is None

