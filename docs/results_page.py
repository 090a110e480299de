"""The Results page's tables, made from `cvae eval`'s JSON files in docs/results/.

A page that says `<!-- results:NAME -->` gets group NAME's table: one row a figure, its summary
over the group's files (the median of the training seeds, or the mean and standard deviation
for few-label runs, as that field reports them), each file's own value, and the command that
makes the files. So no page can quote a figure that its JSON does not hold:
tests/test_results_page.py reads the JSON again on its own and checks every cell.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MARKER = re.compile(r"<!-- results:([a-z0-9-]+) -->")
INLINE = re.compile(r"<!-- result:([a-z0-9-]+):([a-z_.]+) -->")  # one figure's summary


@dataclasses.dataclass(frozen=True)
class Figure:
    label: str
    path: tuple[str, ...]  # keys into the eval JSON
    percent: bool = False  # a share, shown as a percentage
    digits: int = 2

    def read(self, results: dict) -> float:
        value = results
        for key in self.path:
            value = value[key]
        return float(value)

    def show(self, value: float) -> str:
        return f"{100 * value:.{self.digits}f}%" if self.percent else f"{value:.{self.digits}f}"


@dataclasses.dataclass(frozen=True)
class Group:
    files: str  # a glob in docs/results/
    command: str
    figures: tuple[Figure, ...]
    summary: str = "median"  # or "mean ± sd"

    def paths(self) -> list[Path]:
        return sorted(RESULTS.glob(self.files))

    def summarise(self, values: list[float], figure: Figure) -> str:
        if self.summary == "median":
            return figure.show(statistics.median(values))
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{figure.show(statistics.mean(values))} ± {figure.show(spread)}"


BOUNDS = (Figure("-log p(x\\|y), nats", ("iwae", "nll_conditional")),
          Figure("-log p(x), nats (the label summed out)", ("iwae", "nll_marginal")),
          Figure("Bayes' rule's test error", ("iwae", "bayes_rule", "error"), percent=True))
SAMPLES = (Figure("sample accuracy", ("fidelity", "samples", "accuracy"), percent=True),
           Figure("FD of the samples", ("fidelity", "samples", "fd")),
           Figure("precision", ("fidelity", "samples", "precision"), digits=3),
           Figure("recall", ("fidelity", "samples", "recall"), digits=3),
           Figure("label swap read as the new digit", ("label_swap", "accuracy"), percent=True),
           Figure("FD of reconstructions of test digits", ("fidelity", "reconstructions", "fd")),
           Figure("FD of real test digits (reference)", ("fidelity", "real", "fd")))
Q_Y = (Figure("test error of q(y\\|x)", ("classification", "q_y_given_x", "error"),
              percent=True),)

# Each seed trains into a folder of its own: a run resumes where its folder's config matches,
# and refuses one that does not (docs/checkpoints.md), so seed S never lands in seed 0's run.
GROUPS = {
    "default": Group("default-seed[0-9].json", "`make train CHECKPOINT_DIR=runs/default-S "
                     "ARGS='--seed S'`, then `make eval CHECKPOINT_DIR=runs/default-S`",
                     BOUNDS + SAMPLES),
    "default-published": Group(
        "default-published-seed*.json", "`make train CHECKPOINT_DIR=runs/default-S "
        "ARGS='--seed S'`, then `cvae eval --checkpoint-dir runs/default-S --iwae-k 5000 "
        "--iwae-k-marginal 10 --no-fidelity`", BOUNDS),
    "likelihood": Group(
        "likelihood-seed*.json", "`cvae train --preset likelihood --seed S --checkpoint-dir "
        "runs/likelihood-S`, then `cvae train --preset likelihood-dreg --seed S --init-from "
        "runs/likelihood-S --checkpoint-dir runs/likelihood-dreg-S`, then `cvae eval "
        "--checkpoint-dir runs/likelihood-dreg-S --iwae-k 5000 --iwae-k-marginal 10` (what "
        "`make likelihood` runs for seed 0)", BOUNDS),
    "conv": Group("conv-seed[0-9].json", "`make train CHECKPOINT_DIR=checkpoints-conv "
                  "ARGS='--preset conv'`, then `make eval CHECKPOINT_DIR=checkpoints-conv`, on "
                  "one NVIDIA H200 ([On a GPU](gpu.md))", BOUNDS + SAMPLES),
    "semi-100": Group("semi-100-seed*.json", "`cvae train --preset semi --seed S "
                      "--checkpoint-dir runs/semi-S`, then `cvae eval --checkpoint-dir "
                      "runs/semi-S` (what `make semi` runs for seed 0)", Q_Y, "mean ± sd"),
    "semi-1000": Group("semi-1000-seed*.json", "`cvae train --preset semi --labels 1000 --seed S "
                       "--checkpoint-dir runs/semi-1000-S`, then `cvae eval --checkpoint-dir "
                       "runs/semi-1000-S`", Q_Y, "mean ± sd"),
}


def table(name: str) -> str:
    group = GROUPS[name]
    runs = [json.loads(path.read_text()) for path in group.paths()]
    if not runs:
        raise ValueError(f"results group {name!r}: no files match docs/results/{group.files}")
    seeds = [str(run.get("seed", run.get("config", {}).get("seed", "?"))) for run in runs]
    header = f"| figure | {group.summary} | " + " | ".join(f"seed {s}" for s in seeds) + " |"
    rows = [header, "|---|---:|" + "---:|" * len(runs)]
    for figure in group.figures:
        values = [figure.read(run) for run in runs]
        rows.append(f"| {figure.label} | {group.summarise(values, figure)} | "
                    + " | ".join(figure.show(v) for v in values) + " |")
    recorded = any("recorded" in run for run in runs)
    source = (" Transcribed from runs whose JSON was not kept (the files say so)."
              if recorded else "")
    trained = f"training seed{'s' * (len(seeds) > 1)} {', '.join(seeds)}"
    return ("\n".join(rows) + f"\n\nMade by: {group.command}, {trained}." + source
            + f" Files: `docs/results/{group.files}`.\n")


def summary(name: str, path: str) -> str:
    """Group NAME's summary of the figure at `path` (dotted keys), as its table shows it."""
    group = GROUPS[name]
    figure = next(f for f in group.figures if ".".join(f.path) == path)
    runs = [json.loads(p.read_text()) for p in group.paths()]
    return group.summarise([figure.read(run) for run in runs], figure)


def render(markdown: str) -> str:
    """Every `<!-- results:NAME -->` marker replaced by its table, and every
    `<!-- result:NAME:PATH -->` by that one figure's summary."""
    markdown = MARKER.sub(lambda match: table(match.group(1)), markdown)
    return INLINE.sub(lambda match: summary(match.group(1), match.group(2)), markdown)
