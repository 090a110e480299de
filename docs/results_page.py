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

from cvae.evaluation.fidelity import CLASSIFIER_VERSION
from cvae.training.choices import MIXTURE_SHARPNESS

RESULTS = Path(__file__).resolve().parent / "results"
MARKER = re.compile(r"<!-- results:([a-z0-9-]+) -->")
INLINE = re.compile(r"<!-- result:([a-z0-9-]+):([a-z_.]+) -->")  # one figure's summary


@dataclasses.dataclass(frozen=True)
class Figure:
    label: str
    path: tuple[str, ...]  # keys into the eval JSON
    percent: bool = False  # a share, shown as a percentage
    digits: int = 2
    over: tuple[str, ...] = ()  # keys of a figure this one is divided by (a ratio)

    def read(self, results: dict) -> float:
        value = _at(results, self.path)
        return value / _at(results, self.over) if self.over else value

    def show(self, value: float) -> str:
        return f"{100 * value:.{self.digits}f}%" if self.percent else f"{value:.{self.digits}f}"


def _at(results: dict, path: tuple[str, ...]) -> float:
    for key in path:
        results = results[key]
    return float(results)


@dataclasses.dataclass(frozen=True)
class Group:
    """A table: the runs of `seeds`, each made by `steps` (shell commands, `{seed}` filled in)
    whose last writes the eval JSON `output`, kept as docs/results/<prefix>-seed<S>.json."""

    prefix: str
    steps: tuple[str, ...]
    output: str
    figures: tuple[Figure, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    summary: str = "median"  # or "mean ± sd"
    cost: str = ""  # what one seed's steps take, measured where it says

    @property
    def files(self) -> str:
        return f"{self.prefix}-seed*.json"

    def result(self, seed: int) -> Path:
        """Where seed `seed`'s eval JSON is kept."""
        return RESULTS / f"{self.prefix}-seed{seed}.json"

    @staticmethod
    def seed_of(path: Path) -> str:
        return path.stem.rsplit("-seed", 1)[1]

    @property
    def command(self) -> str:
        return ", then ".join(f"`{step.format(seed='S')}`" for step in self.steps)

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
# A data set of one's own, scored in its own classifier's features: the scale to read sample FD
# against is the FD of two halves of its real test set; sample accuracy against the
# classifier's accuracy on real test images.
OWN = (Figure("epochs (chosen from the data and this machine's speed)",
              ("config", "run", "epochs"), digits=0),
       Figure("-ELBO, bits/dim", ("elbo", "bits_per_dim"), digits=3),
       Figure("sample accuracy", ("fidelity", "samples", "accuracy"), percent=True, digits=1),
       Figure("classifier's accuracy on real test images", ("fidelity", "real", "accuracy"),
              percent=True, digits=1),
       Figure("FD of the samples", ("fidelity", "samples", "fd")),
       Figure("FD of real test images (reference)", ("fidelity", "real", "fd")),
       Figure("samples' FD / real FD", ("fidelity", "samples", "fd"),
              over=("fidelity", "real", "fd")),
       Figure("precision", ("fidelity", "samples", "precision"), digits=3),
       Figure("recall", ("fidelity", "samples", "recall"), digits=3),
       Figure("FD of reconstructions of test images", ("fidelity", "reconstructions", "fd")))
Q_Y = (Figure("test error of q(y\\|x)", ("classification", "q_y_given_x", "error"),
              percent=True),)

# Each seed trains into a folder of its own: a run resumes where its folder's config matches,
# and refuses one that does not (docs/checkpoints.md), so seed S never lands in seed 0's run.
# `make results TABLE=NAME` runs a group's steps (docs/results_run.py).
DEFAULT_TRAIN = "make train CHECKPOINT_DIR=runs/default-{seed} ARGS='--seed {seed}'"
PUBLISHED_EVAL = "--iwae-k 5000 --iwae-k-marginal 10"  # the published protocol's bounds
# The example data sets (docs/own-images.md): written, prepared once, trained with the
# settings `cvae train` chooses from the data, and scored without the IWAE bounds. Rendered at
# the sharpness it chooses for the mixture (cvae.training.choices.MIXTURE_SHARPNESS), passed
# so that runs trained before it chose one render alike (rendering never changes training).
OWN_EVAL = f"--iwae-k 0 --iwae-k-marginal 0 --pixel-sharpness {MIXTURE_SHARPNESS:g}"


def own_group(name: str, dataset: str, prepare: tuple[str, ...], cost: str) -> Group:
    """Group `name`: `prepare` (run unless data/<dataset> exists), then the chosen defaults."""
    prepared = tuple(f"test -d data/{dataset} || {step}" for step in prepare)
    run = f"runs/{name}-{{seed}}"
    return Group(name, (*prepared,
                        f"cvae train --dataset {dataset} --seed {{seed}} --checkpoint-dir {run} "
                        "--no-progress",
                        f"cvae eval --checkpoint-dir {run} {OWN_EVAL} --json {run}/eval.json"),
                 f"{run}/eval.json", OWN, cost=cost)


GROUPS = {
    "default": Group(
        "default", (DEFAULT_TRAIN, "make eval CHECKPOINT_DIR=runs/default-{seed}"),
        "runs/default-{seed}/eval.json", BOUNDS + SAMPLES,
        cost="on 2 CPU cores about 4 minutes of training and 14 of evaluation (13 of them the "
             "IWAE bounds), plus about 6 the first time, training MNIST's classifier (then "
             "kept); on one H200 49 s of training alone, 4.1 minutes and 2.6 of "
             "evaluation with 12 runs sharing it"),
    "default-published": Group(
        "default-published", (DEFAULT_TRAIN, "cvae eval --checkpoint-dir runs/default-{seed} "
                              f"{PUBLISHED_EVAL} --no-fidelity "
                              "--json runs/default-{seed}/published.json"),
        "runs/default-{seed}/published.json", BOUNDS,
        cost="the default's training (nothing left to do after `default`), then about 10 "
             "minutes of evaluation on 2 CPU cores (AVX-512), about 1 minute on one H200 "
             "shared by 12 runs"),
    "likelihood": Group(
        "likelihood", ("cvae train --preset likelihood --seed {seed} --checkpoint-dir "
                       "runs/likelihood-{seed} --no-progress",
                       "cvae train --preset likelihood-dreg --seed {seed} --init-from "
                       "runs/likelihood-{seed} --checkpoint-dir runs/likelihood-dreg-{seed} "
                       "--no-progress",
                       f"cvae eval --checkpoint-dir runs/likelihood-dreg-{{seed}} {PUBLISHED_EVAL}"
                       " --json runs/likelihood-dreg-{seed}/eval.json"),
        "runs/likelihood-dreg-{seed}/eval.json", BOUNDS,
        cost="about 30 minutes of training and 7 of evaluation on 2 CPU cores"),
    "conv": Group(
        "conv", ("make train CHECKPOINT_DIR=checkpoints-conv ARGS='--preset conv'",
                 "make eval CHECKPOINT_DIR=checkpoints-conv"),
        "checkpoints-conv/eval.json", BOUNDS + SAMPLES, seeds=(0,),
        cost="about 40 minutes of training on 2 CPU cores; on one H200 81 s, and about 75 s "
             "of evaluation"),
    "semi-100": Group(
        "semi-100", ("cvae train --preset semi --seed {seed} --checkpoint-dir runs/semi-{seed} "
                     "--no-progress",
                     "cvae eval --checkpoint-dir runs/semi-{seed} "
                     "--json runs/semi-{seed}/eval.json"),
        "runs/semi-{seed}/eval.json", Q_Y, summary="mean ± sd",
        cost="on 2 CPU cores about 4 minutes of training and 14 of evaluation; on one "
             "H200 2.6 minutes of training with 12 runs sharing it"),
    "semi-1000": Group(
        "semi-1000", ("cvae train --preset semi --labels 1000 --seed {seed} --checkpoint-dir "
                      "runs/semi-1000-{seed} --no-progress",
                      "cvae eval --checkpoint-dir runs/semi-1000-{seed} "
                      "--json runs/semi-1000-{seed}/eval.json"),
        "runs/semi-1000-{seed}/eval.json", Q_Y, summary="mean ± sd",
        cost="on 2 CPU cores about 4 minutes of training and 14 of evaluation; on one "
             "H200 2.6 minutes of training with 12 runs sharing it"),
    "fashion": own_group("fashion", "fashion_mnist", (),
                         cost="on 2 CPU cores about 30 minutes of training (the chosen "
                              "epochs aim at it: 97 to 99 on an AMD EPYC with AVX-512, about "
                              "29 on an Intel Xeon, where the samples sit farther) and 2 of "
                              "evaluation, plus about 6 the first time, training the set's "
                              "classifier (then kept)"),
    "digits": own_group("digits", "digits", (
        "python scripts/example_datasets.py digits runs/digits.npz",
        "cvae data --from runs/digits.npz --name digits"),
        cost="on 2 CPU cores about 2 minutes of training and 1 of evaluation"),
    "colour": own_group("colour", "colour", (
        "python scripts/example_datasets.py colour runs/colour.npz",
        "cvae data --from runs/colour.npz --name colour"),
        cost="on 2 CPU cores about 8 minutes of training (140 epochs, a step timed at 320 to "
        "343 ms on an AMD EPYC with AVX-512; about 18 minutes at 0.78 s on an Intel Xeon) and 2 "
        "of evaluation; the first evaluation also trains the set's classifier (then kept), "
        "about 1 minute"),
    "emoji": own_group("emoji", "emoji", (
        "mkdir -p runs",
        "npm pack --pack-destination runs emoji-datasource-google@16.0.0",
        "python scripts/example_datasets.py emoji runs/emoji "
        "--source runs/emoji-datasource-google-16.0.0.tgz",
        "cvae data --from runs/emoji --name emoji"),
        cost="on 2 CPU cores about 30 minutes of training (the conv model: 54 to 58 epochs "
        "chosen at a step timed at 1.57 to 1.45 s on an AMD EPYC with AVX-512; 29 to 40 at 2.9 "
        "to 2.1 s on an Intel Xeon), then 2 to 3 of evaluation; the first evaluation also "
        "trains the set's classifier (then kept): 1,872 steps, about 5.5 minutes on the AMD "
        "EPYC, 10 on the Intel Xeon"),
}


def table(name: str) -> str:
    group = GROUPS[name]
    paths = group.paths()
    runs = [json.loads(path.read_text()) for path in paths]
    if not runs:
        raise ValueError(f"results group {name!r}: no files match docs/results/{group.files}")
    seeds = [group.seed_of(path) for path in paths]
    header = f"| figure | {group.summary} | " + " | ".join(f"seed {s}" for s in seeds) + " |"
    rows = [header, "|---|---:|" + "---:|" * len(runs)]
    for figure in group.figures:
        values = [figure.read(run) for run in runs]
        rows.append(f"| {figure.label} | {group.summarise(values, figure)} | "
                    + " | ".join(figure.show(v) for v in values) + " |")
    trained = f"training seed{'s' * (len(seeds) > 1)} {', '.join(seeds)}"
    return ("\n".join(rows) + f"\n\nMade by: {group.command}, {trained}."
            + provenance(runs, group) + f" Files: `docs/results/{group.files}`.\n")


def provenance(runs: list[dict], group: Group) -> str:
    """Where the runs ran, from their run records, which fidelity classifier scored their
    samples where it is not the one `cvae eval` trains now (for a table that shows sample
    figures), and what a seed costs."""
    machines = sorted({machine(run["record"]) for run in runs if "record" in run})
    where = f" Run on {' and '.join(machines)} (the run records)." if machines else ""
    shows_samples = any(figure.path[0] == "fidelity" for figure in group.figures)
    samples = classifier_note(runs) + sample_size_note(runs) if shows_samples else ""
    return where + samples + (f" Cost: {group.cost}." if group.cost else "")


def classifier_note(runs: list[dict]) -> str:
    """A sentence naming the fidelity classifier's recipe (its version) where the runs were
    scored by an older one than `cvae eval`'s, whose features put FD on another scale."""
    versions = sorted({run["fidelity"]["classifier"].get("version", 1) for run in runs
                       if "classifier" in run.get("fidelity", {})})
    if not versions or versions == [CLASSIFIER_VERSION]:
        return ""
    named = " and ".join(f"v{v}" for v in versions)
    return (f" Sample figures in the features of the fidelity classifier's recipe {named};"
            f" `cvae eval` now trains v{CLASSIFIER_VERSION} ([Evaluation](evaluation.md)), whose"
            " features read other distances, so a rerun's figures are not comparable with"
            " these.")


def sample_size_note(runs: list[dict]) -> str:
    """A sentence where the samples outnumbered the real half they were scored against (`cvae
    eval` before it matched the two): a Fréchet distance shrinks as its sets grow, so those
    samples' FD, and its ratio to the real halves', read better than at equal sizes."""
    sizes = sorted({(sum(run["fidelity"]["samples"]["label_counts"]), run["test_examples"] // 2)
                    for run in runs if "label_counts" in run.get("fidelity", {}).get("samples", {})
                    and "test_examples" in run})
    outnumbered = [(drawn, half) for drawn, half in sizes if drawn > 2 * half]
    if not outnumbered:
        return ""
    drawn, half = outnumbered[0]
    return (f" Samples scored {drawn:,} against a real half of {half:,} test images: the"
            " Fréchet distance falls as its sets grow, so their FD and its ratio to the real"
            " halves' read better than at equal sizes, which `cvae eval` now draws"
            " ([Evaluation](evaluation.md#why-the-samples-follow-the-test-labels)).")


def machine(record: dict) -> str:
    """The record's accelerator, or its CPU where it ran on the CPU."""
    kinds = sorted({d["kind"] for d in record.get("devices", []) if d.get("platform") != "cpu"})
    return ", ".join(f"one {kind}" for kind in kinds) or record.get("cpu", "an unnamed CPU")


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
