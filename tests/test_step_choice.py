"""`--step N | best | latest` (docs/checkpoints.md, "Choosing a step"): which checkpoint step
`cvae sample`, `eval`, `export` and `serve` read, `best` as the writer's manager ranks steps.

One run, `chosen_run`, serves every test: the tiny session run's steps 4 and 8 written again
through the project's own `save_checkpoint`, with validation losses chosen so that the older
step is the best one (1.0 against 2.0).
"""

from __future__ import annotations

import httpx
import pytest

from cvae.cli.main import main
from cvae.errors import CheckpointError, StepNotFound
from cvae.evaluation.run import EvalOptions, run_eval
from cvae.export.load import exported_step, open_sampler
from cvae.export.run import finished_checkpoint
from cvae.model.store import BEST_METRIC, load_trained_model
from cvae.training.checkpoints import create_manager, load_checkpoint, save_checkpoint
from service.checkpoints import CheckpointWatcher, list_steps
from servers import cvae_server
from test_digit_image import encoded, seven

LOSSES = {4: 1.0, 8: 2.0}  # step -> validation loss: the older step is the best
BEST, LATEST = 4, 8


def write_steps(source, directory, losses: dict[int, float | None]) -> None:
    """Steps of `source` written into `directory` with these validation losses (None: none
    recorded, as in checkpoints from before the validation split)."""
    manager = create_manager(directory)
    for step, loss in losses.items():
        checkpoint = load_checkpoint(source, step)
        metrics = {name: value for name, value in checkpoint.metrics.items()
                   if name != BEST_METRIC}
        save_checkpoint(manager, checkpoint.state, checkpoint.config,
                        metrics=metrics if loss is None else {**metrics, BEST_METRIC: loss})
    manager.close()


@pytest.fixture(scope="module")
def chosen_run(trained_run, tmp_path_factory):
    directory = tmp_path_factory.mktemp("chosen") / "run"
    write_steps(trained_run.directory, directory, LOSSES)
    return directory


def test_best_is_the_lowest_validation_loss_and_latest_the_newest(chosen_run):
    assert load_trained_model(chosen_run, "best").step == BEST
    assert load_trained_model(chosen_run, "latest").step == LATEST
    assert load_trained_model(chosen_run).step == LATEST
    assert load_trained_model(chosen_run, BEST).step == BEST


def test_a_missing_step_is_refused_listing_the_steps_there(chosen_run):
    with pytest.raises(StepNotFound, match=r"no step 5 in .* \(steps there: 4, 8\)$"):
        load_trained_model(chosen_run, 5)


def test_best_needs_a_step_that_recorded_a_validation_loss(trained_run, tmp_path):
    write_steps(trained_run.directory, tmp_path, {4: None})
    with pytest.raises(CheckpointError, match=f"no step .* records a {BEST_METRIC}"):
        load_trained_model(tmp_path, "best")


def test_sample_draws_the_chosen_step_and_refuses_a_missing_one(chosen_run, tmp_path, capsys):
    out = tmp_path / "best.png"
    assert main(["sample", "--checkpoint-dir", str(chosen_run), "--step", "best",
                 "--n", "2", "--out", str(out)]) == 0
    assert f"step {BEST}," in capsys.readouterr().out and out.is_file()
    assert main(["sample", "--checkpoint-dir", str(chosen_run), "--step", "5",
                 "--out", str(tmp_path / "none.png")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "(steps there: 4, 8)" in error
    assert not (tmp_path / "none.png").exists()


def test_step_flag_takes_a_number_best_or_latest_only(capsys):
    with pytest.raises(SystemExit) as exit_code:
        main(["sample", "--step", "newest", "--out", "x.png"])
    assert exit_code.value.code == 2
    assert "'newest' is not a step number, latest or best" in capsys.readouterr().err


def test_eval_scores_the_chosen_step(chosen_run, data_dir):
    results = run_eval(chosen_run, data_dir, EvalOptions(iwae_k=0, test_limit=16,
                                                         fidelity=False), step="best")
    assert results["step"] == BEST


def test_export_takes_the_chosen_step_and_refuses_a_missing_one(chosen_run, tmp_path, capsys):
    assert finished_checkpoint(chosen_run, "best").step == BEST
    assert finished_checkpoint(chosen_run).step == LATEST
    assert main(["export", "--checkpoint-dir", str(chosen_run), "--step", "12",
                 "--out", str(tmp_path / "out")]) == 2
    assert "no step 12" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_serve_refuses_a_missing_step_before_any_worker_starts(chosen_run, capsys):
    assert main(["serve", "--checkpoint-dir", str(chosen_run), "--step", "5"]) == 2
    assert "(steps there: 4, 8)" in capsys.readouterr().err


def test_serve_best_serves_another_step_than_latest(chosen_run, tmp_path):
    """Over a real `cvae serve`: /readyz and the replies' headers name the best step."""
    with cvae_server(chosen_run, tmp_path / "server.log", "--step", "best") as server:
        ready = httpx.get(f"{server.url}/readyz").json()
        picture = httpx.get(f"{server.url}/sample", params={"digit": 1, "n": 1, "seed": 0})
        reading = httpx.post(f"{server.url}/classify", content=encoded(seven()))
    assert (ready["step"], ready["chosen_by"]) == (BEST, "best")
    assert picture.headers["X-Checkpoint-Step"] == str(BEST) != str(LATEST)
    assert reading.headers["X-Checkpoint-Step"] == str(reading.json()["step"]) == str(BEST)


def test_the_service_follows_the_best_and_holds_a_fixed_step(trained_run, tmp_path):
    """A new step with a lower loss lands: `best` moves to it, `--step 4` stays."""
    write_steps(trained_run.directory, tmp_path, {4: 2.0})
    watchers = {choice: CheckpointWatcher(tmp_path, step=choice) for choice in ("best", 4)}
    for watcher in watchers.values():
        watcher.refresh()
        assert watcher.current.step == 4
    write_steps(trained_run.directory, tmp_path, {8: 1.0})
    for watcher in watchers.values():
        watcher.refresh()
    assert {choice: w.current.step for choice, w in watchers.items()} == {"best": 8, 4: 4}


def test_a_fixed_step_not_there_is_named_in_the_note(chosen_run):
    watcher = CheckpointWatcher(chosen_run, step=6)
    watcher.refresh()
    assert watcher.current is None
    assert watcher.note == f"--step 6: no step 6 in {chosen_run} (steps there: 4, 8)"


def test_an_exported_folder_holds_one_step_and_refuses_another(exported, capsys):
    """Its one step is its latest and its best; another number is refused before anything
    loads, by `cvae sample` and by `cvae serve`."""
    folder = exported("standard")
    step = exported_step(folder)
    with pytest.raises(StepNotFound, match=rf"\(steps there: {step}\)$"):
        open_sampler(folder, step + 1)
    assert main(["serve", "--checkpoint-dir", str(folder), "--step", str(step + 1)]) == 2
    assert f"no step {step + 1} in {folder} (steps there: {step})" in capsys.readouterr().err
    watcher = CheckpointWatcher(folder, step="best")
    assert watcher.chosen(list_steps(folder)) == [step]
