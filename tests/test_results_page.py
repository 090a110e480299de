"""The Results page quotes only what `cvae eval`'s JSON in docs/results/ holds: every cell of
its generated tables, read again here from the files on their own, and no figure of ours
written by hand."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
sys.path.insert(0, str(DOCS))
import results_page  # noqa: E402
import results_run  # noqa: E402


def _value(run: dict, figure) -> float:
    def at(path):
        value = run
        for key in path:
            value = value[key]
        return float(value)
    return at(figure.path) / at(figure.over) if figure.over else at(figure.path)


def _shown(value: float, figure) -> str:
    return f"{100 * value:.{figure.digits}f}%" if figure.percent else f"{value:.{figure.digits}f}"


@pytest.mark.parametrize("name", sorted(results_page.GROUPS))
def test_every_cell_of_a_results_table_is_its_json(name):
    group = results_page.GROUPS[name]
    files = sorted((DOCS / "results").glob(group.files))
    runs = [json.loads(path.read_text()) for path in files]
    assert runs, f"{name}: no files"
    rows = [line for line in results_page.table(name).splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(group.figures)
    for row, figure in zip(rows, group.figures, strict=True):
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
        values = [_value(run, figure) for run in runs]
        assert cells[0] == figure.label
        assert cells[2:] == [_shown(v, figure) for v in values]
        if group.summary == "median":
            assert cells[1] == _shown(statistics.median(values), figure)
        else:
            assert cells[1] == (f"{_shown(statistics.mean(values), figure)} ± "
                                f"{_shown(statistics.stdev(values), figure)}")


def test_the_results_page_has_no_figure_of_ours_written_by_hand():
    text = (DOCS / "results.md").read_text()
    ours = [line for line in text.splitlines() if line.startswith("| **ours")]
    few_labels = [line for line in text.splitlines() if re.match(r"\| 1000? \|", line)]
    assert ours and few_labels
    for line in ours:  # our rows of the published table: markers only
        assert not re.search(r"\d", re.sub(r"<!--.*?-->", "", line)), line
    for line in few_labels:  # our column, the last, of the few-label table
        assert re.fullmatch(r"<!-- result:[a-z0-9-]+:[a-z_.]+ -->", line.split("|")[-2].strip())
    rendered = results_page.render(text)
    assert "<!-- result" not in rendered
    for name in set(re.findall(r"<!-- results?:([a-z0-9-]+)", text)):
        assert name in results_page.GROUPS


def test_a_table_scored_by_an_older_fidelity_classifier_says_so():
    current = results_page.CLASSIFIER_VERSION
    scored = [{"fidelity": {"classifier": {"version": v}}} for v in (current - 1, current)]
    note = results_page.classifier_note(scored)
    assert f"recipe v{current - 1} and v{current};" in note and f"now trains v{current}" in note
    assert results_page.classifier_note(scored[1:]) == ""
    assert results_page.classifier_note([{"elbo": {}}]) == ""  # no samples scored: nothing said


def test_a_table_of_bounds_only_says_nothing_of_the_samples_classifier():
    current = results_page.CLASSIFIER_VERSION
    scored = [{"fidelity": {"classifier": {"version": v}}} for v in (current - 1, current)]
    bounds = results_page.Group("bounds", ("true",), "b.json", results_page.BOUNDS)
    samples = results_page.Group("samples", ("true",), "s.json", results_page.SAMPLES)
    assert "recipe" not in results_page.provenance(scored, bounds)
    assert f"recipe v{current - 1} and v{current};" in results_page.provenance(scored, samples)


def test_a_table_whose_samples_outnumbered_the_real_half_says_so():
    def run(drawn, test_examples):
        return {"fidelity": {"samples": {"label_counts": [drawn // 2, drawn - drawn // 2]}},
                "test_examples": test_examples}

    note = results_page.sample_size_note([run(5000, 359), run(180, 359)])
    assert "Samples scored 5,000 against a real half of 179 test images" in note
    assert results_page.sample_size_note([run(5000, 10000), run(179, 359)]) == ""
    assert results_page.sample_size_note([{"elbo": {}}]) == ""  # no samples scored


def test_a_group_without_files_fails_the_build_rather_than_rendering_nothing(monkeypatch):
    empty = results_page.Group("no-such", ("true",), "nothing.json", results_page.BOUNDS)
    monkeypatch.setitem(results_page.GROUPS, "empty", empty)
    with pytest.raises(ValueError, match="no files match"):
        results_page.table("empty")


def test_every_result_comes_from_a_run_its_table_names():
    """Each file carries the run record `cvae eval` copies from the checkpoint, and that run was
    started by one of its table's steps, for the seed in the file's name."""
    for name, group in results_page.GROUPS.items():
        steps = [step for step in group.steps if "train" in step]
        for path in group.paths():
            run = json.loads(path.read_text())
            assert "record" in run, f"{path.name}: no run record"
            seed = int(group.seed_of(path))
            command = run["record"]["command"]
            assert command[:2] == ["cvae", "train"], path.name
            wanted = [_words(step.format(seed=seed)) for step in steps]
            assert any(set(_training_flags(command)) <= set(words) for words in wanted), (
                path.name, command, wanted)


def _words(step: str) -> list[str]:
    """A step's words, as the run record keeps them (`make train` passes ARGS through)."""
    words = step.replace("'", " ").replace("=", " ").split()
    return ["--checkpoint-dir" if w == "CHECKPOINT_DIR" else w for w in words if w != "ARGS"]


def _training_flags(command: list[str]) -> list[str]:
    """A recorded `cvae train` command's own words, less what `make train` adds."""
    added = {"--data-dir", "data", "cvae", "train"}
    return [word for word in command if word not in added]


def _toy_group(record: bool) -> results_page.Group:
    body = '{{"record": {{"command": ["cvae"]}}}}' if record else '{{"iwae": {{}}}}'
    return results_page.Group("toy", ("mkdir -p runs/toy-{seed}",
                                      f"echo '{body}' > runs/toy-{{seed}}/eval.json"),
                              "runs/toy-{seed}/eval.json", results_page.BOUNDS)


def test_make_results_copies_each_seeds_eval_json(tmp_path, monkeypatch):
    monkeypatch.setitem(results_page.GROUPS, "toy", _toy_group(record=True))
    monkeypatch.setattr(results_page, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    written = results_run.rerun("toy", (3, 5), cwd=tmp_path)
    assert [p.name for p in written] == ["toy-seed3.json", "toy-seed5.json"]
    assert written[1].read_bytes() == (tmp_path / "runs/toy-5/eval.json").read_bytes()


def test_make_results_keeps_nothing_without_a_run_record_or_when_a_step_fails(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(results_page, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    monkeypatch.setitem(results_page.GROUPS, "toy", _toy_group(record=False))
    with pytest.raises(SystemExit, match="no run record"):
        results_run.rerun("toy", (0,), cwd=tmp_path)
    failing = results_page.Group("toy", ("exit 3",), "x.json", results_page.BOUNDS)
    monkeypatch.setitem(results_page.GROUPS, "toy", failing)
    with pytest.raises(subprocess.CalledProcessError):
        results_run.rerun("toy", (0,), cwd=tmp_path)
    assert not list((tmp_path / "results").iterdir())
