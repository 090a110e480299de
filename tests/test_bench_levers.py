"""bench/model_levers.py's table: medians over the seeds that finished, a refused lever's
reason, and one table merged from several runs' JSON files."""

import json

from bench import model_levers


def _run(seed, nll, fd, *, seconds=100.0, stopped=False):
    return {"seed": seed, "train": {"seconds": seconds, "stopped_by_budget": stopped,
                                    "error": None},
            "eval": {"step": 1000 + seed, "iwae": {"nll_conditional": nll},
                     "fidelity": {"samples": {"fd": fd}}}}


def test_merged_runs_give_one_table_of_medians(tmp_path):
    first = {"load": [0.5, 1.0], "levers": {
        "default": {"flags": [], "runs": [_run(0, 90.0, 5.0), _run(1, 80.0, 4.0),
                                          _run(2, 85.0, 9.0)]},
        "dreg-k5": {"flags": ["--objective", "dreg"], "runs": [
            {"seed": 0, "train": {"seconds": 1.0, "stopped_by_budget": False,
                                  "error": "objective='dreg': not trained | yet"},
             "eval": None}]}}}
    second = {"load": [2.0, 3.0], "levers": {
        "dreg-k5": {"flags": ["--objective", "dreg"], "runs": [
            _run(0, 84.0, 6.0, seconds=300, stopped=True), _run(1, 83.0, 7.0, seconds=200)]}}}
    files = []
    for index, results in enumerate((first, second)):
        files.append(tmp_path / f"{index}.json")
        files[-1].write_text(json.dumps(results))
    out = tmp_path / "table.md"
    assert model_levers.main(["--merge", *map(str, files), "--out", str(out)]) == 0
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| lever")}
    assert list(rows) == ["default", "dreg-k5"]
    assert rows["default"][1:5] == ["3", "100", "1001", "85.00"]  # seeds, wall, steps, median
    assert rows["default"][6] == "n/a"  # a figure no run reported
    assert rows["dreg-k5"][1:5] == ["2", "250 (budget)", "1000", "83.50"]
    assert "load average 0.5 at the start and 3.0 at the end" in out.read_text()


def test_a_refused_lever_says_why_in_its_row():
    lever = {"flags": [], "runs": [{"seed": 0, "train": {"error": "not trained | yet"},
                                    "eval": None}]}
    row = model_levers.median_row("ladder", lever)
    assert row.startswith("| ladder | 0 | | | not trained / yet |")
    assert row.count("|") == 5 + len(model_levers.COLUMNS)


def test_a_few_label_levers_row_gives_its_classifiers_median_error():
    runs = [_run(seed, 95.0, 7.0) for seed in range(3)]
    for run, error in zip(runs, (0.05, 0.03, 0.04)):
        run["eval"]["classification"] = {"q_y_given_x": {"error": error}}
    cells = model_levers.median_row("semi-vat", {"flags": [], "runs": runs}).split(" | ")
    assert cells[-1] == "0.0400 |"  # the last column, median of the three labelled sets
    assert model_levers.COLUMNS[-1][0] == "q(y\\|x) err."


def test_a_staged_lever_splits_into_its_stages_in_order():
    flags = ["--preset", "likelihood", model_levers.THEN, "--preset", "likelihood-dreg"]
    assert model_levers.split_stages(flags) == [["--preset", "likelihood"],
                                                ["--preset", "likelihood-dreg"]]
    assert model_levers.split_stages(["--epochs", "2"]) == [["--epochs", "2"]]
    staged = model_levers.LEVERS["likelihood-59k-640-dreg-20"]
    assert [stage[:2] for stage in model_levers.split_stages(staged)] == [
        ["--preset", "likelihood"], ["--preset", "likelihood-dreg"]]
