"""`README.md`: the exported folder's model card, in the Hugging Face Hub's layout: YAML front
matter (library, tags, dataset, and `model-index` with the metrics of `cvae eval`), then the
sample grid, intended use and limitations, how it was trained, what the export verified, and
how to load it in a few lines of Python, with and without this package. Pure Python: the
snippets are tested as written (tests/test_export_card.py).
"""

from __future__ import annotations

import dataclasses
import json

from cvae.config.sections import as_flags
from cvae.config import presets
from cvae.export.config_file import config_json
from cvae.model.registry import code_dim, noise_dim
from cvae.data.specs import spec_of

# Where a built-in dataset's images came from, for the card's limitations.
PROVENANCE = {"mnist": "The training digits were written by US census employees and "
                       "high-school students; other hands and scripts are outside what it "
                       "has seen."}
EXAMPLE_CLASS = 7  # the class the snippets draw (the last one of a model with fewer)
LICENSE = "apache-2.0"  # the project's (LICENSE, pyproject.toml), as the Hub spells it
TAGS = ("jax", "flax", "vae", "conditional-vae", "image-generation", "safetensors", "onnx",
        "stablehlo")


def yaml_string(value) -> str:
    """A YAML scalar: JSON's double-quoted strings are YAML's, numbers as they are."""
    return json.dumps(value)


def eval_metrics(results: dict) -> list[tuple[str, str, float]]:
    """(type, name, value) of the headline figures in `cvae eval`'s JSON, where present."""
    found = []
    elbo, iwae = results.get("elbo") or {}, results.get("iwae") or {}
    if "neg_elbo" in elbo:
        found.append(("neg_elbo", "negative ELBO (nats)", elbo["neg_elbo"]))
    if "nll_conditional" in iwae:
        found.append(("nll", f"-log p(x|y), IWAE K={iwae.get('k')} (nats)",
                      iwae["nll_conditional"]))
    if "nll_marginal" in iwae:
        found.append(("nll", "-log p(x) (nats)", iwae["nll_marginal"]))
    samples = ((results.get("fidelity") or {}).get("samples")) or {}
    for key, kind, name in (("accuracy", "accuracy", "sample accuracy (a classifier reads "
                                                     "the digit asked for)"),
                            ("fd", "frechet_distance", "Fréchet distance of samples "
                                                       "(classifier features)"),
                            ("precision", "precision", "sample precision (k-NN)"),
                            ("recall", "recall", "sample recall (k-NN)")):
        if samples.get(key) is not None:
            found.append((kind, name, samples[key]))
    q_y = ((results.get("classification") or {}).get("q_y_given_x")) or {}
    if q_y.get("error") is not None:
        found.append(("error_rate", "q(y|x) test error", q_y["error"]))
    return [(kind, name, float(value)) for kind, name, value in found if value is not None]


def front_matter(name: str, config, metrics: list[tuple[str, str, float]]) -> str:
    """The YAML header; its dataset is the spec's Hub id and title (`cvae.data.specs`), or the
    dataset's own name for one that is not on the Hub."""
    spec = spec_of(config.data.dataset)
    dataset_id, dataset_name = spec.hub_id or spec.name, spec.title
    lines = ["---", "library_name: cvae", f"license: {LICENSE}", "tags:",
             *(f"- {tag}" for tag in TAGS), "datasets:", f"- {dataset_id}"]
    if metrics:
        lines += ["model-index:", f"- name: {yaml_string(name)}", "  results:",
                  "  - task:", "      type: image-generation",
                  "      name: Class-conditional image generation",
                  "    dataset:", f"      name: {yaml_string(dataset_name)}",
                  f"      type: {dataset_id}", "      split: test", "    metrics:"]
        for kind, metric, value in metrics:
            lines += [f"    - type: {kind}", f"      name: {yaml_string(metric)}",
                      f"      value: {value:.6g}"]
    return "\n".join(lines + ["---", ""])


def train_command(config) -> str:
    """The `cvae train` command that makes this config from the default preset."""
    changed = {path: mine for path, (mine, _) in config.diff(presets.default()).items()
               if mine is not None}
    return " ".join(["cvae train", *as_flags(changed)])


@dataclasses.dataclass(frozen=True)
class CardFacts:
    """What the card says, gathered by `cvae.export.run`."""

    name: str
    step: int
    config: object  # cvae.config.Config
    files: dict[str, int]  # file name -> bytes
    eval_results: dict | None  # `cvae eval`'s JSON for this step, or None
    eval_note: str  # where the figures came from, or why there are none
    verification: dict  # cvae.export.run's report
    has_classifier: bool
    record: dict | None = None  # the run record of the exported step (cvae.training.record)


FILE_ROLES = {
    "model.safetensors": "every weight the model samples, encodes and classifies with",
    "config.json": "the run's config (`cvae.config.Config`): rebuilds the model; with its "
                   "dataset's image shape and class names",
    "README.md": "this card",
    "samples.png": "one row per class, seed 0",
    "sample.stablehlo": "`sample(noise, label) -> images`, `jax.export` (CPU and CUDA)",
    "sample.onnx": "the same function as ONNX",
    "encode.stablehlo": "`encode(images, label) -> mean, logvar, neg_elbo`, `jax.export`",
    "encode.onnx": "the same function as ONNX",
    "classify.stablehlo": "`classify(images) -> probabilities`, q(y|x), `jax.export`",
    "classify.onnx": "the same function as ONNX",
    "manifest.json": "each file's sha256 and size",
}


def model_card(facts: CardFacts) -> str:
    config = facts.config
    metrics = eval_metrics(facts.eval_results) if facts.eval_results else []
    sections = [front_matter(facts.name, config, metrics),
                f"# {facts.name}: a class-conditioned VAE for "
                f"{spec_of(config.data.dataset).title} images\n",
                "![one row per class, seed 0](samples.png)\n",
                f"A conditional variational autoencoder (JAX + Flax) trained with "
                f"cvae to step {facts.step}: give it one of its classes and "
                f"noise, and it draws an image of that class in a style the noise picks. "
                f"Its classes, by label: {_classes(spec_of(config.data.dataset))}. "
                f"Exported by `cvae export`; docs/export.md in the cvae repository tells "
                f"what each file is and what is guaranteed.\n",
                _files(facts), _metrics(facts, metrics), _use_and_limits(facts),
                _training(facts), _record(facts), _verification(facts), _snippets(facts)]
    return "\n".join(sections)


def _classes(spec) -> str:
    """'0 `cat`, 1 `dog`, 2 `bird`' (the first 40 of a long list)."""
    shown = [f"{index} `{name}`" for index, name in enumerate(spec.class_names[:40])]
    more = [f"and {spec.num_classes - 40} more (config.json)"] if spec.num_classes > 40 else []
    return ", ".join(shown + more)


def _image_kind(spec) -> str:
    """'28x28 grayscale' or '32x32 RGB'."""
    return f"{spec.height}x{spec.width} {'grayscale' if spec.channels == 1 else 'RGB'}"


def _files(facts: CardFacts) -> str:
    rows = [f"| `{name}` | {_cell(FILE_ROLES.get(name, ''))} | {size:,} |"
            for name, size in sorted(facts.files.items())]
    return "\n".join(["## Files\n", "| file | what | bytes |", "|---|---|---|", *rows,
                      "| `manifest.json` | each file's sha256 and size | |", ""])


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a `|` would end the cell."""
    return text.replace("|", "\\|")


def _metrics(facts: CardFacts, metrics) -> str:
    if not metrics:
        return f"## Metrics\n\nNo figures here: {facts.eval_note}.\n"
    rows = [f"| {_cell(name)} | {value:.4g} |" for _, name, value in metrics]
    return "\n".join([f"## Metrics\n\n{facts.eval_note}.\n", "| metric | value |",
                      "|---|---|", *rows, ""])


def _use_and_limits(facts: CardFacts) -> str:
    spec = spec_of(facts.config.data.dataset)
    kind = _image_kind(spec)
    classifier = ("It also reads images: `classify` is q(y|x), trained with "
                  f"{facts.config.labels.count} labelled images. " if facts.has_classifier else "")
    provenance = f" {PROVENANCE[spec.name]}" if spec.name in PROVENANCE else ""
    return (
        "## Intended use and limitations\n\n"
        f"For learning, demos and tests: drawing {kind} images of a chosen class, "
        "carrying one image's style to the other classes (`encode`, then `sample`'s decoder), "
        f"and small experiments with portable model formats. {classifier}"
        f"Not for anything that matters: it knows only the {spec.num_classes} classes of its "
        f"training set ({spec.title}), draws some wrong or blended images (see Metrics), and "
        f"its likelihoods describe {kind} images like those, not images in "
        f"general.{provenance}\n")


def _training(facts: CardFacts) -> str:
    text = config_json(facts.config)
    return (f"## Training\n\n`{train_command(facts.config)}` (from the default preset; "
            f"`cvae train --help` explains each flag), then `cvae export`. The config:\n\n"
            f"<details><summary>config.json</summary>\n\n```json\n{text}\n```\n\n"
            f"</details>\n")


def _record(facts: CardFacts) -> str:
    """What made the run, from its record; a line saying there is none for older runs."""
    record = facts.record
    if not record:
        return ("## Run record\n\nNone: the step was saved before cvae recorded its runs "
                "(a checkpoint step's record.json).\n")
    git = record.get("git")
    code = (f"commit `{git['commit']}`" + (" with uncommitted changes" if git["dirty"] else "")
            if git else "no git tree")
    versions = ", ".join(f"{name} {version}" for name, version in
                         sorted(record.get("versions", {}).items()) if version)
    kinds = sorted({device["kind"] for device in record.get("devices", [])})
    dataset = record.get("dataset") or {}
    digest = dataset.get("manifest_sha256")
    rows = [("command", f"`{' '.join(record.get('command', []))}`"), ("code", code),
            ("versions", versions),
            ("devices", f"{len(record.get('devices', []))} x {', '.join(kinds)}"),
            ("CPU", record.get("cpu", "")),
            ("dataset", f"{dataset.get('name')}, " + (f"sha256 `{digest}`" if digest
                                                       else "no manifest hash")),
            ("trained", f"{record.get('started_at')} to {record.get('ended_at')} (this "
                        f"invocation, to this step)")]
    return "\n".join(["## Run record\n", "The checkpoint step's record.json, also in "
                       "manifest.json:\n", "| what | value |", "|---|---|",
                       *(f"| {name} | {_cell(str(value))} |" for name, value in rows), ""])


def _verification(facts: CardFacts) -> str:
    report = facts.verification
    stablehlo = ", ".join(f"`{name}` on {rows} rows" for name, rows in
                          report["stablehlo_rows"].items())
    onnx = report["onnx"]
    lines = [
        "## What the export verified\n",
        f"- StableHLO: the deserialized functions gave the JAX sampler's bits ({stablehlo}; "
        f"the sampler's block shapes, on the exporting CPU: {report['cpu']}).",
        f"- ONNX Runtime (CPU): `sample` on {onnx['rows']:,} noise vectors "
        f"({onnx['rows'] // spec_of(facts.config.data.dataset).num_classes:,} per class): "
        f"largest pixel difference "
        f"{onnx['sample_max_abs']:.2g} (tolerance 1e-5), largest uint8 difference "
        f"{onnx['sample_max_uint8']} (tolerance 1); `encode`"
        + (" and `classify`" if "classify_max_relative" in onnx else "")
        + f": largest relative difference "
        f"{max(v for k, v in onnx.items() if k.endswith('_relative')):.2g} (tolerance 1e-5).",
        "- `model.safetensors` and `config.json` read back into the same variables.", ""]
    return "\n".join(lines)


def _snippets(facts: CardFacts) -> str:
    latent = noise_dim(facts.config)
    wider = (f" (every latent layer's, the top layer's first: wider than the {code} values "
              f"of a code)" if (code := code_dim(facts.config)) != latent else "")
    sharpness = f"{facts.config.drawing.pixel_sharpness:g}"
    spec = spec_of(facts.config.data.dataset)
    shape = ", ".join(map(str, spec.stored_shape))
    example = min(EXAMPLE_CLASS, spec.num_classes - 1)
    name = json.dumps(spec.class_names[example])
    return f'''## Use it

Each snippet runs as written in this folder.

With cvae installed (`pip install -e .` in its repository; no Orbax checkpoint, no
optimizer): the sampler of `cvae sample` and `cvae serve`, the same PNG bytes as the
checkpoint this came from (`cvae sample --checkpoint-dir . --out grid.png` and
`cvae serve --checkpoint-dir .` work on this folder too).

```python
from cvae.export.load import open_sampler

sampler = open_sampler(".")
label = sampler.class_names.index({name})  # a class by its name
png = sampler.sample_png(digit=label, n=16, seed=0)
with open("class-{example}.png", "wb") as file:
    file.write(png)
```

With only `onnxruntime` and `numpy`: `sample.onnx` maps noise ~ N(0, t^2 I) of
{latent} dimensions{wider} and a label to pixels in [0, 1], sigmoid({sharpness} x the decoder's
logits) (`pixel_sharpness` in `config.json`; 1 would be the decoder's plain means).

```python
import numpy as np
import onnxruntime as ort

session = ort.InferenceSession("sample.onnx", providers=["CPUExecutionProvider"])
noise = np.random.default_rng(0).standard_normal((16, {latent}), dtype=np.float32)
labels = np.full(16, {example}, dtype=np.int32)  # class {name}
(images,) = session.run(None, {{"noise": noise, "label": labels}})  # f32[16, {shape}]
pixels = np.round(np.clip(images, 0, 1) * 255).astype(np.uint8)
print(pixels.shape, pixels.dtype, pixels.max())
```

With only `jax` (no Flax, no cvae): the serialized StableHLO, any batch size. On the CPU
that exported it, batches of at least 64 rows give the sampler's bits.

```python
import jax
import numpy as np

with open("sample.stablehlo", "rb") as file:
    sample = jax.export.deserialize(bytearray(file.read()))
noise = np.random.default_rng(0).standard_normal((64, {latent}), dtype=np.float32)
labels = np.full(64, {example}, dtype=np.int32)
images = np.asarray(sample.call(noise, labels))  # f32[64, {shape}]
print(images.shape, float(images.min()), float(images.max()))
```

The weights alone, by name (`safetensors`):

```python
from safetensors.numpy import load_file

weights = load_file("model.safetensors")
for name in sorted(weights)[:4]:
    print(name, weights[name].shape)
```

In a web page, `onnxruntime-web` runs `sample.onnx` the same way (see `cvae serve`'s page,
"draw in the browser").
'''
