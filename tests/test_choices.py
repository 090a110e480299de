"""`cvae train --dataset NAME` picks what nobody set from the data (`cvae.training.choices`):
the likelihood from the pixels, the validation split from the size, the epochs from a stated
time; a flag or a file wins, and MNIST's default stays as it is."""

from __future__ import annotations

import numpy as np
import pytest

from cvae.cli.main import main
from cvae.config import presets
from cvae.data.profile import DataProfile, profile
from cvae.training.choices import MIXTURE_SHARPNESS, NEARLY_BINARY, choose
from cvae.training.step_cost import StepCost, measure_step


def data_profile(images: int = 60000, between: float = 0.5, channels: int = 1,
                 side: int = 28) -> DataProfile:
    return DataProfile(side, side, channels, images, 10, between, False)


def at(step_seconds: float):
    """A step's cost fixed at `step_seconds`: nothing timed, so every call chooses alike."""
    return lambda config, data: StepCost(step_seconds, 3)


def test_the_profile_reads_how_binary_and_how_grey_the_pixels_are():
    rng = np.random.default_rng(0)
    ink = (rng.random((50, 8, 8)) < 0.2).astype(np.uint8) * 255
    levels = rng.integers(0, 256, (50, 8, 8), dtype=np.uint8)
    labels = np.arange(50) % 5
    assert profile(ink, labels).between_share == 0.0
    assert profile(levels, labels).between_share == pytest.approx(192 / 256, abs=0.03)
    grey = np.repeat(levels[..., None], 3, axis=-1)
    assert profile(grey, labels).grey_colour and profile(grey, labels).channels == 3
    assert profile(levels, labels).classes == 5


def test_grey_levels_get_the_logistic_mixture_and_binary_ink_the_bernoulli():
    config = presets.default()
    grey = choose(config, data_profile(), given=set(), step_cost=at(0.001))
    assert grey.changes["likelihood.name"] == "logistic_mixture"
    assert grey.reasons[0].startswith("likelihood  logistic_mixture")
    assert grey.changes["drawing.pixel_sharpness"] == MIXTURE_SHARPNESS  # the mixture's render
    sharpness_given = choose(config, data_profile(), given={"drawing.pixel_sharpness"},
                             step_cost=at(0.001))
    assert "drawing.pixel_sharpness" not in sharpness_given.changes
    ink = choose(config, data_profile(between=NEARLY_BINARY / 2), given=set(),
                 step_cost=at(0.001))
    assert "likelihood.name" not in ink.changes
    assert ink.changes == {}  # MNIST-like data at this rate: the default as it is


def test_large_colour_images_get_the_conv_model_and_others_the_mlp():
    config, timed = presets.default(), []

    def cost(chosen, data):
        timed.append(chosen.model.options.architecture)
        return StepCost(0.001, 3)

    emoji = choose(config, data_profile(3000, channels=3, side=64), given=set(), step_cost=cost)
    assert emoji.changes["model.options.architecture"] == "conv"
    assert any(reason.startswith("model       the conv") for reason in emoji.reasons)
    assert timed == ["conv"]  # the epochs fit the chosen model's step
    for kept in (data_profile(3000, side=64),  # grey
                 data_profile(3000, channels=3, side=32),  # smaller
                 data_profile(3000, channels=3, side=66)):  # sides that do not halve twice
        assert "model.options.architecture" not in choose(config, kept, given=set(),
                                                          step_cost=at(0.001)).changes
    for given in ({"model.options.architecture"}, {"model.name"}):
        chosen = choose(config, data_profile(3000, channels=3, side=64), given=given,
                        step_cost=at(0.001))
        assert "model.options.architecture" not in chosen.changes


def test_what_a_flag_or_a_file_set_is_never_chosen():
    chosen = choose(presets.default(), data_profile(images=120), given={
        "likelihood.name", "data.validation_size", "run.epochs"}, step_cost=at(0.001))
    assert chosen.changes == {}


def test_a_mixture_given_by_a_flag_is_rendered_as_a_chosen_one():
    """`--likelihood logistic_mixture` on grey-level data: the pixels drawn from near their
    likeliest component as where the mixture is chosen, not the mean's blend of modes; other
    likelihoods keep the config's sharpness, and a given sharpness wins."""
    given = {"likelihood.name", "run.epochs"}
    mixture = presets.default().updated({"likelihood.name": "logistic_mixture"})
    chosen = choose(mixture, data_profile(), given=given, step_cost=at(0.001))
    assert chosen.changes == {"drawing.pixel_sharpness": MIXTURE_SHARPNESS}
    assert chosen.reasons[-1].startswith("sharpness   10")
    logistic = presets.default().updated({"likelihood.name": "logistic"})
    assert choose(logistic, data_profile(), given=given, step_cost=at(0.001)).changes == {}
    assert choose(mixture, data_profile(), given=given | {"drawing.pixel_sharpness"},
                  step_cost=at(0.001)).changes == {}


def test_the_split_fits_the_data_and_the_epochs_the_time():
    small = choose(presets.default(), data_profile(images=120), given=set(), step_cost=at(0.001))
    assert small.changes["data.validation_size"] == 12
    slow = choose(presets.default(), data_profile(), given=set(), step_cost=at(10.0))
    assert slow.changes["run.epochs"] == 1 and "at most 30 minutes" in slow.reasons[-1]


@pytest.mark.parametrize("options", [
    {"likelihood.name": "logistic_mixture", "model.options.hidden_sizes": (32,)},
    {"model.options.architecture": "conv", "model.options.hidden_sizes": (32,)},
    pytest.param({"model.name": "hierarchical", "model.options.width": 8,
                  "model.options.depths": (1, 1, 1)},
                 marks=pytest.mark.slow),  # its compile: about 11 s, in `make test-slow`
], ids=["mlp-mixture", "conv", "hierarchical"])
def test_a_step_is_timed_as_training_runs_it_for_every_family(options):
    """The run's own train chunk on images of the data's shape (16x16 RGB here, 12 of each
    class), several steps a call: any family's step, not an estimate for the MLP's. The
    run's config is left as it was, and a slower step buys fewer epochs."""
    config = presets.default().updated({"run.batch_size": 12, **options})
    colour = DataProfile(16, 16, 3, 2000, 3, 0.5, False)
    cost = measure_step(config, colour)
    assert 0 < cost.seconds < float("inf") and cost.calls >= 2
    assert cost.steps > cost.calls  # a fast step is timed several to a call, as training runs
    assert config == presets.default().updated({"run.batch_size": 12, **options})
    slower = choose(config, colour, given=set(), step_cost=at(100 * cost.seconds))
    faster = choose(config, colour, given=set(), step_cost=at(cost.seconds))
    assert slower.changes["run.epochs"] < faster.changes.get("run.epochs", config.run.epochs)
    assert "a training step of batch 12 timed at" in faster.reasons[-1]


def test_a_resumed_run_keeps_the_epochs_it_chose_whatever_the_speed_now():
    """A stopped run, resumed on a machine that is now faster (or busier), ends where it would
    have; a folder holding another run (here another seed) does not lend its epochs."""
    config = presets.default()
    started = choose(config, data_profile(), given=set(), step_cost=at(0.2))
    stored = config.updated(started.changes)
    resumed = choose(config, data_profile(), given=set(), step_cost=at(0.05), resumed=stored)
    fresh = choose(config, data_profile(), given=set(), step_cost=at(0.05))
    assert resumed.changes["run.epochs"] == started.changes["run.epochs"]
    assert "those of the run it resumes" in resumed.reasons[-1]
    assert fresh.changes["run.epochs"] > started.changes["run.epochs"]
    other = choose(config, data_profile(), given=set(), step_cost=at(0.05),
                   resumed=stored.updated({"run.seed": 5}))
    assert other == fresh


def test_a_likelihood_option_given_alone_is_timed_and_resumed_with_the_likelihood():
    """`--mixture-components 3` without `--likelihood`: the step is timed with 3 components,
    and a resumed run, whose stored config has them, keeps its epochs."""
    path = "likelihood.options.mixture_components"
    config, timed = presets.default(), []

    def cost(chosen, data):
        timed.append(chosen.likelihood.options.mixture_components)
        return StepCost(0.2, 3)

    started = choose(config, data_profile(), given={path}, held={path: 3}, step_cost=cost)
    assert timed == [3] and started.changes[path] == 3
    assert started.reasons[0].startswith("likelihood  logistic_mixture, 3 components (given)")
    stored = config.updated(started.changes)
    resumed = choose(config, data_profile(), given={path}, held={path: 3}, step_cost=at(0.05),
                     resumed=stored)
    assert resumed.changes["run.epochs"] == started.changes["run.epochs"]
    assert "those of the run it resumes" in resumed.reasons[-1]


@pytest.fixture
def grey_data(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.arange(300) % 3
    images = rng.integers(0, 256, (300, 12, 12), dtype=np.uint8)
    np.savez(tmp_path / "grey.npz", images=images, labels=labels,
             class_names=np.array(["a", "b", "c"]))
    assert main(["data", "--from", str(tmp_path / "grey.npz"), "--name", "grey",
                 "--data-dir", str(tmp_path / "data")]) == 0
    return tmp_path / "data"


def test_train_prints_its_choices_and_print_config_shows_them(grey_data, capsys):
    assert main(["train", "--dataset", "grey", "--data-dir", str(grey_data),
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "# cvae train chose from the data (grey):" in printed
    assert '[likelihood]\nname = "logistic_mixture"' in printed
    assert "validation_size = 24" in printed  # a tenth of the 240 training images
    assert main(["train", "--dataset", "grey", "--data-dir", str(grey_data), "--likelihood",
                 "bernoulli", "--validation-size", "30", "--epochs", "3", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert '[likelihood]\nname = "bernoulli"' in printed and "validation_size = 30" in printed


def test_a_likelihood_option_goes_to_the_likelihood_the_data_chooses(grey_data, tmp_path,
                                                                     capsys):
    """--mixture-components without --likelihood: the grey images' chosen mixture takes it;
    nearly binary images, which get the Bernoulli, refuse it in one line that says why, and
    MNIST, whose likelihood is the preset's, as before."""
    flags = ["--mixture-components", "3", "--epochs", "3", "--print-config"]
    assert main(["train", "--dataset", "grey", "--data-dir", str(grey_data), *flags]) == 0
    printed = capsys.readouterr().out
    assert "likelihood  logistic_mixture, 3 components (given): grey-level" in printed
    assert '[likelihood]\nname = "logistic_mixture"' in printed
    assert "mixture_components = 3" in printed
    images = np.where(np.random.default_rng(1).random((300, 12, 12)) < 0.2, 255, 0)
    np.savez(tmp_path / "ink.npz", images=images.astype(np.uint8), labels=np.arange(300) % 3,
             class_names=np.array(["a", "b", "c"]))
    assert main(["data", "--from", str(tmp_path / "ink.npz"), "--name", "ink",
                 "--data-dir", str(grey_data)]) == 0
    capsys.readouterr()
    assert main(["train", "--dataset", "ink", "--data-dir", str(grey_data), *flags]) == 2
    assert capsys.readouterr().err.strip() == (
        "cvae train: error: mixture_components: an option of the likelihood logistic_mixture, "
        "not of this run's bernoulli (--likelihood); the run's likelihood is chosen from the "
        "data: nearly binary grey images (0% of pixel values between the ends)")
    assert main(["train", *flags]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "not of this run's bernoulli (--likelihood); the run's likelihood is its preset's")
    # Out of range: refused as any setting is, before the data is read (there is none here).
    assert main(["train", "--dataset", "grey", "--data-dir", str(tmp_path / "none"),
                 "--mixture-components", "0", "--epochs", "3", "--print-config"]) == 2
    assert "mixture_components=0: must be" in capsys.readouterr().err


def test_a_files_dataset_gives_way_to_the_flag(grey_data, tmp_path, capsys):
    (tmp_path / "run.toml").write_text('[data]\ndataset = "not-prepared"\n')
    assert main(["train", "--config", str(tmp_path / "run.toml"), "--dataset", "grey",
                 "--data-dir", str(grey_data), "--epochs", "3", "--print-config"]) == 0
    assert 'dataset = "grey"' in capsys.readouterr().out


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_a_run_that_chooses_from_the_data_trains(grey_data, tmp_path):
    """The choice measures the machine's speed on JAX's backend: a real `cvae train` process
    joins the distributed runtime (or finds it has none) before that, as JAX requires, and
    trains with what it chose. About 10 CPU-s (a tiny MLP, two steps)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "cvae.cli", "train", "--dataset", "grey", "--data-dir",
         str(grey_data), "--checkpoint-dir", str(tmp_path / "run"), "--hidden-sizes", "16",
         "--latent-dim", "2", "--max-steps", "2", "--steps-per-call", "1", "--no-progress"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cvae train chose from the data (grey):" in result.stdout
    assert "likelihood  logistic_mixture" in result.stdout
    assert "trained to step 2" in result.stdout
