"""The `cvae` command as a user runs it: real subprocesses, real files."""

import argparse
import dataclasses
import re
import subprocess
import sys

import pytest
from PIL import Image

from cvae.cli.main import build_parser, config_from_args
from cvae.config import components, flat
from cvae.config.presets import PRESETS, default, seed
from cvae.config.sections import Config, as_flags
from cvae.data.synthetic import write_synthetic_idx


def image_size_mode(path):
    with Image.open(path) as image:
        return image.size, image.mode


# 512 of the 600 synthetic training examples (64 held out for validation): 32 steps per epoch.
SMALL_RUN = ("--train-limit", 512, "--validation-size", 64, "--batch-size", 16, "--hidden-sizes",
             "64,32", "--latent-dim", 4, "--warmup-steps", 0, "--steps-per-call", 10,
             "--eval-batch-size", 100, "--eval-every", 1, "--no-progress")


def cvae(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "cvae.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    write_synthetic_idx(root / "data", num_train=600, num_test=100)
    result = cvae("train", "--data-dir", root / "data", "--checkpoint-dir", root / "ck",
                  "--max-steps", 50, *SMALL_RUN)
    assert result.returncode == 0, result.stderr
    return root, result


def test_train_smoke_writes_checkpoint_metrics_and_grid(trained):
    root, result = trained
    assert "trained to step 50" in result.stdout
    ck = root / "ck"
    assert (ck / "50").is_dir()
    assert len((ck / "metrics.jsonl").read_text().splitlines()) == 2  # epoch 1 (32 steps), cut
    assert image_size_mode(ck / "samples_latest.png") == ((10 * 30 + 2, 10 * 30 + 2), "L")


def test_sample_writes_png_of_the_expected_size(trained):
    root, _ = trained
    out = root / "seven.png"
    result = cvae("sample", "--checkpoint-dir", root / "ck", "--digit", 7, "--n", 10,
                  "--scale", 2, "--pad", 3, "--seed", 1, "--out", out)
    assert result.returncode == 0, result.stderr
    cols, rows = 4, 3  # ceil(sqrt(10)) columns
    assert image_size_mode(out) == ((cols * (56 + 3) + 3, rows * (56 + 3) + 3), "L")
    again = root / "seven-again.png"
    cvae("sample", "--checkpoint-dir", root / "ck", "--digit", 7, "--n", 10, "--scale", 2,
         "--pad", 3, "--seed", 1, "--out", again)
    assert again.read_bytes() == out.read_bytes()


def test_sample_without_digit_has_one_row_per_digit(trained):
    root, _ = trained
    out = root / "all.png"
    assert cvae("sample", "--checkpoint-dir", root / "ck", "--n", 3, "--out", out).returncode == 0
    assert image_size_mode(out) == ((3 * 30 + 2, 10 * 30 + 2), "L")


def test_train_again_resumes_then_does_nothing_once_finished(trained):
    """Resumed with a higher --max-steps, the run continues the step count; run once more, a
    finished run does nothing and keeps its checkpoint."""
    root, _ = trained
    args = ("train", "--data-dir", root / "data", "--checkpoint-dir", root / "ck",
            "--max-steps", 60, *SMALL_RUN)
    result = cvae(*args)
    assert result.returncode == 0, result.stderr
    assert "trained to step 60" in result.stdout
    before = {p: p.stat().st_mtime_ns for p in (root / "ck" / "60").rglob("*")}
    result = cvae(*args)  # used to fail: Orbax refused to save step 60 a second time
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stdout and "already at step 60 of 60" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in (root / "ck" / "60").rglob("*")} == before


@pytest.mark.parametrize("args, fragment", [
    # Any class index a dataset may have (each model then checks its own: below).
    (["sample", "--digit", "1000", "--out", "x.png"], "--digit: 1000 is outside [0, 999]"),
    (["sample", "--digit", "seven", "--out", "x.png"], "--digit: 'seven' is not a valid int"),
    (["sample", "--temperature", "0", "--out", "x.png"], "--temperature: 0.0 is outside (0, 2]"),
    (["sample", "--scale", "50", "--out", "x.png"], "--scale: 50 is outside [1, 8]"),
    (["train", "--likelihood", "poisson"], "invalid choice: 'poisson'"),
    (["serve", "--log-format", "yaml"], "--log-format: invalid choice: 'yaml'"),
])
def test_bad_flags_name_the_flag_and_range(args, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(args)
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err


def test_a_class_the_model_lacks_is_one_line_naming_its_classes(trained):
    root, _ = trained
    result = cvae("sample", "--checkpoint-dir", root / "ck", "--digit", 10, "--out",
                  root / "ten.png")
    assert result.returncode == 2
    assert result.stderr.strip() == ("cvae sample: error: digit 10: this model's classes are "
                                      "0..9")
    assert not (root / "ten.png").exists()


def test_bad_config_value_is_one_line_naming_the_field(tmp_path):
    result = cvae("train", "--batch-size", 0, "--data-dir", tmp_path, "--checkpoint-dir", tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "cvae train: error: run.batch_size=0: must be >= 1"


def test_a_refused_combination_is_refused_in_one_line(tmp_path):
    """A depth belongs to the ladder family: without --model ladder it is refused by name."""
    result = cvae("train", "--stochastic-layers", 2, "--batch-norm", "--data-dir", tmp_path,
                  "--checkpoint-dir", tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == ("cvae train: error: stochastic_layers: an option of the "
                                      "model ladder, not of this run's cvae (--model)")


def test_missing_data_is_one_line_saying_what_to_run(tmp_path):
    result = cvae("train", "--data-dir", tmp_path / "nodata", "--checkpoint-dir", tmp_path / "ck")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cvae data" in result.stderr and "Traceback" not in result.stderr


def test_empty_checkpoint_dir_is_one_line_saying_what_to_run(tmp_path):
    result = cvae("sample", "--checkpoint-dir", tmp_path, "--out", tmp_path / "x.png")
    assert result.returncode == 2
    assert "no checkpoint in" in result.stderr and "make train" in result.stderr
    assert "Traceback" not in result.stderr


# A value for every setting, each different from the default preset's, all valid together but
# free bits with the importance-weighted objective, and each component's options with another
# component (test_every_config_field_is_a_train_flag).
EVERY_FIELD = dict(
    dataset="fashion_mnist", data_source="torchvision", train_limit=100, binarization="none",
    architecture="conv", hidden_sizes=(8, 4), latent_dim=3, activation="tanh",
    label_conditioning="first", likelihood="gaussian", logvar_bound=5.0, dropout_rate=0.25,
    batch_norm=True, kl_weight=0.25, kl_schedule="linear", kl_warmup_steps=7, free_bits=0.5,
    optimizer="sgd", learning_rate=0.01, end_learning_rate=0.001, lr_schedule="linear",
    warmup_steps=3, weight_decay=0.001, momentum=0.5, grad_clip_norm=2.0, accumulation_steps=2,
    ema_decay=0.99, freeze="decoder", batch_size=32, epochs=2, max_steps=9, seed=11,
    steps_per_call=5, eval_batch_size=50, early_stopping_patience=4,
    early_stopping_min_delta=0.1, keep_checkpoints=2, validation_size=500, prior="vamp",
    prior_components=3, prior_codes="means", eval_every=2, schedule_epochs=3, labels="100",
    classifier_weight=2.5, labelled_per_batch=8, classifier_shift=1, consistency_weight=4.0,
    entropy_weight=0.5, vat_weight=1.5, vat_epsilon=2.0,
    objective="dreg", importance_samples=5, model="ladder", stochastic_layers=3,
    upper_latent_dim=4,
    pseudo_inputs=7, pixel_sharpness=1.5, truncation=0.5,
    width=16, depths=(1, 1), latent_channels=2, mixture_components=5)
# Components each command names beyond EVERY_FIELD's, for the options of those components.
OTHER_COMPONENTS = dict(model="hierarchical", likelihood="logistic_mixture")


def test_every_config_field_is_a_train_flag():
    """`config.as_flags` (the model card's train command, the levers' pinned flags) writes
    flags that `cvae train` parses back into the same config, every setting changed."""
    names = flat.flat_names(Config)
    assert sorted(EVERY_FIELD) == sorted(names)  # a new setting needs a value here
    assert sorted(names.values()) == sorted(flat.all_leaves(Config))
    defaults, leaves = default().leaves(), flat.all_leaves(Config)
    for name, value in EVERY_FIELD.items():
        path = names[name]
        own = defaults.get(path, next(  # an option of a component the default does not name
            f.default for f in dataclasses.fields(leaves[path].owner)
            if f.name == leaves[path].field))
        assert value != own, name
        if path.endswith(".name"):
            assert value != getattr(default(), path.split(".")[0]).name, name
    assert as_flags({"model.options.batch_norm": False}) == ["--no-batch-norm"]
    for name, value in OTHER_COMPONENTS.items():
        assert value in components.names(name) and value != getattr(default(), name).name
    # Free bits floor the ELBO's KL only, and a component's options go with that component:
    # the importance-weighted objective, the VampPrior and the Gaussian go in a second
    # command, the third family and likelihood with their options in a third, so that each
    # command's settings are valid together.
    third = ("width", "depths", "latent_channels", "mixture_components")
    commands = [
        {name: value for name, value in EVERY_FIELD.items() if name not in (
            "objective", "importance_samples", "prior", "pseudo_inputs", "likelihood", *third)},
        {name: value for name, value in EVERY_FIELD.items() if name not in (
            "free_bits", "prior_components", "prior_codes", "binarization", *third)},
        {**{name: EVERY_FIELD[name] for name in third}, **OTHER_COMPONENTS}]
    assert set().union(*commands) == set(EVERY_FIELD)
    for given in commands:
        flags = as_flags({names[name]: value for name, value in given.items()})
        config = config_from_args(build_parser().parse_args(["train", *flags]))
        assert config == default().replace(**given)
        assert all(config.leaves()[names[name]] == value for name, value in given.items())
    # Fields not given come from the preset.
    assert config_from_args(build_parser().parse_args(["train", "--preset", "seed"])) == seed()


def subcommands() -> dict:
    """name -> the subcommand's parser, as `cvae --help` lists them."""
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_main_help_lists_every_command_and_every_preset():
    """`cvae --help` as a user runs it: every subcommand (launch too), each preset by name."""
    result = cvae("--help")
    assert result.returncode == 0, result.stderr
    listed = re.findall(r"^    (\w+) ", result.stdout, flags=re.M)
    assert listed == list(subcommands()) == ["data", "train", "launch", "sample", "eval",
                                             "serve", "export"]
    presets = result.stdout.split("presets", 1)[1]
    for name in PRESETS:
        assert re.search(rf"^  {name} ", presets, flags=re.M), name
    assert "/sample over HTTP" not in result.stdout  # serve serves much more


@pytest.mark.parametrize("name", ["data", "train", "launch", "sample", "eval", "serve",
                                  "export"])
def test_every_command_help_has_a_description_and_an_example(name):
    parser = subcommands()[name]
    text = parser.format_help()
    assert parser.description and len(parser.description.split()) >= 10
    assert parser.description.splitlines()[0] in text
    examples = text.split("\nexamples:\n", 1)[1]
    assert re.search(rf"^  cvae {name}( |$)", examples, flags=re.M), examples
    assert max(map(len, text.splitlines())) <= 100  # fits a terminal without odd wrapping


def test_serve_help_says_classify_reads_a_digit_with_every_model():
    """Not only a few-label model's: the route reads by Bayes' rule without a classifier."""
    text = " ".join(subcommands()["serve"].format_help().split())
    assert "POST /classify reads an uploaded digit with any model" in text
    assert "q(y|x) when trained with --labels N, otherwise by Bayes' rule" in text


def test_train_help_explains_every_flag_with_its_field_doc():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    actions = {a.dest: a for a in train._actions}
    leaves = flat.all_leaves(Config)
    for name, path in flat.flat_names(Config).items():
        text, kind = actions[name].help, path.split(".")[0]
        assert "(default " in text, name
        if path.endswith(".name") and kind in components.KINDS:
            # a component's name: each registered component, by name and its doc's gist
            for component in components.names(kind):
                assert f"{component} (" in text, (name, component)
            continue
        assert text.startswith(leaves[path].doc), name
        assert leaves[path].doc.endswith("."), name
    for command, parser in build_parser()._subparsers._group_actions[0].choices.items():
        for action in parser._actions:
            assert action.help, f"cvae {command} {action.option_strings} has no help"
