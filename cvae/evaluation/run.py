"""`cvae eval`: how good a checkpoint is, from its directory alone, on the test set.

Training never reads the test set: its per-epoch figures come from the validation split
(`cvae.training.validation`, whose `create_eval_step` + `evaluate` give the ELBO terms here too).
`run_eval` reads the model for inference (`cvae.model.store.load_trained_model`) and the test
images, and scores them.

Figures (all on the test set; every one lands in the JSON, the main ones in a table on stdout):
- ELBO terms (reconstruction, KL, total) and active latent units (per-dimension KL > 0.01 nats).
- Bernoulli and discretised logistic likelihoods: the IWAE bound with K samples as the negative
  log-likelihood in nats and bits per dimension, on the test set binarised once with a fixed
  seed (the logistic: its 8-bit levels as they are): conditional -log p(x|y) (true label, K
  samples) and marginal -log p(x) = -logsumexp_y' [log p(x|y') - log C] (C the dataset's
  classes; the true label's K-sample term plus `iwae_k_marginal` samples for each other label),
  with the built-in check -log p(x|y') bounds in `cvae.evaluation.iwae.check_marginal`.
- Sample fidelity scored by the dataset's cached classifier (`cvae.evaluation.fidelity`):
  conditional accuracy and Fréchet distance of samples, overall and per class, beside real test
  images.
- Label swap (`cvae.evaluation.label_swap`; the ten grey digits only, else omitted with the
  reason): test digits re-decoded with every other label, read by the same classifier, and how
  much of their slant and stroke width survives.
- Reconstructions of test digits scored like the samples (`cvae.evaluation.reconstructions`):
  the floor no prior can beat, and the samples' FD against it.
- Visual reports (`cvae.evaluation.reports`) next to the JSON, or in --report-dir.
- A model trained with `--labels N` (`cvae.evaluation.classification`): the test error of its
  classifier q(y|x), and of the generative classifier argmax_y p(x|y) (IWAE, --iwae-k-marginal
  samples for every label; 0 = skip).

Cost on 2 CPU cores (10000 test examples): the bounds decode K + (C - 1) * K_marginal latents
per example for C classes (MNIST: 10); K=5000, K_marginal=10 took 389 s for the likelihood
preset's 512-512 model on a 2-core AMD EPYC (AVX-512) with nothing else running. The other
labels carry little of p(x) (-log p(x) came out 2.18 nats above -log p(x|y) for the default
MNIST model and 2.22 for that one, against log 10 = 2.30 if they carried nothing), so a small
K_marginal suffices; raise it with --iwae-k-marginal when time allows. For ranking,
--iwae-limit N scores the bounds on the first N test digits only (K=500 on 2,000 digits is about
50 times cheaper).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from cvae.data.load import load_dataset
from cvae.errors import ConfigError
from cvae.limits import DEFAULT_TEMPERATURE
from cvae.evaluation import (classification, fidelity, iwae, label_swap, reconstructions,
                             reports)
from cvae.config import components
from cvae.model.binarization import scores_levels
from cvae.model.densities import bits_per_dim
from cvae.model.registry import create_model, noise_dim
from cvae.model.store import StepChoice, load_trained_model, read_record
from cvae.sampling.sampler import create_sampler
from cvae.training.step import run_key
from cvae.training.validation import ACTIVE_UNIT_NATS, create_eval_step, evaluate
from cvae.data.specs import spec_of

# The default's samples must score at most this FD ratio against the baseline preset's (`--preset
# seed`), both scored in the same `cvae eval` run: a model that learnt the data, not one that
# blurs it.
FD_RATIO_TARGET = 0.15
DEFAULT_SAMPLES = 500  # generated images a label for the fidelity scores, test set allowing
MAX_CLASS_LINES = 20  # the table shows each class's figures up to this many classes


class EvalCheckError(RuntimeError):
    """A built-in consistency check of the figures failed (a bug, not a user error)."""


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    iwae_k: int = 1000  # importance samples for -log p(x|y); 0 = skip the IWAE bounds
    iwae_k_marginal: int = 10  # samples for each other label in -log p(x); 0 = skip
    iwae_chunk: int = 100  # samples evaluated at once (bounds memory, not the result)
    test_limit: int = 0  # 0 = whole test set, N = the first N test examples
    iwae_limit: int = 0  # the IWAE bounds on the first N of those only (0 = all): cheap ranking
    # Generated images per label, on average, for the fidelity scores; None: DEFAULT_SAMPLES a
    # label, but no more in all than the reference half holds (`sample_counts`).
    samples_per_digit: int | None = None
    balanced_samples: bool = False  # exactly samples_per_digit a label, not the data's proportions
    seed: int = 0  # binarisation, importance samples, generated samples, report picks
    pixel_sharpness: float | None = None  # render at this instead of the checkpoint's own
    truncation: float | None = None  # draw at this instead of the checkpoint's own
    fidelity: bool = True
    classifier_dir: str | None = None  # default <data-dir>/classifier
    report_dir: str | None = None  # default: beside --json; None and no --json = no reports


def elbo_metrics(checkpoint, images_u8: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Reconstruction, KL, loss, negative ELBO (nats) and active units on the given test rows."""
    config = checkpoint.config
    eval_step = create_eval_step(create_model(config), config)
    figures = evaluate(eval_step, checkpoint.variables,
                       images=jnp.asarray(images_u8.reshape(len(labels), -1)),
                       labels=jnp.asarray(labels, jnp.int32), key=run_key(config.run.seed),
                       batch_size=min(config.run.eval_batch_size, len(labels)), config=config)
    return {**figures,
            "bits_per_dim": bits_per_dim(figures["neg_elbo"], spec_of(config.data.dataset).pixels)}


def iwae_metrics(checkpoint, images_u8: np.ndarray, labels: np.ndarray,
                 *, options: EvalOptions) -> dict:
    config = checkpoint.config
    if not config.likelihood.component.bounded or options.iwae_k == 0:
        bounded = [name for name in components.names("likelihood")
                   if components.component("likelihood", name).bounded]
        why = (f"IWAE NLL is defined for the {', '.join(bounded)} likelihoods only (densities "
               f"of the data), not {config.likelihood.name}" if options.iwae_k else "--iwae-k 0")
        return {"iwae": None, "iwae_note": why}
    start = time.perf_counter()
    if options.iwae_limit:
        images_u8, labels = images_u8[:options.iwae_limit], labels[:options.iwae_limit]
    bounds = iwae.test_set_bounds(
        create_model(config), checkpoint.variables, images_u8=images_u8, labels=labels,
        key=jax.random.key(options.seed), num_samples=options.iwae_k,
        marginal_samples=options.iwae_k_marginal, chunk=options.iwae_chunk)
    result = {"k": options.iwae_k, "k_marginal_other_labels": options.iwae_k_marginal,
              "examples": int(len(labels)),
              "binarization": ("none: the 8-bit levels" if scores_levels(config.likelihood.name)
                               else f"dynamic, seed {options.seed}"),
              "nll_conditional": float(-bounds["log_px_given_y"].mean())}
    if "log_px" in bounds:
        # Bayes' rule reads every label's bound of equal K (no label favoured); a model
        # trained with every label answers /classify this way (few-label models keep q(y|x)).
        result["bayes_rule"] = {**iwae.bayes_rule_error(bounds["label_bounds"], labels),
                                "k": options.iwae_k_marginal}
        check = iwae.check_marginal(bounds["log_px_given_y"], bounds["log_px_given_label"],
                                    bounds["log_px"])
        result["nll_marginal"] = float(-bounds["log_px"].mean())
        result["bits_per_dim_marginal"] = bits_per_dim(result["nll_marginal"],
                                                       spec_of(config.data.dataset).pixels)
        result["marginal_check"] = check
        if not check["ok"]:
            raise EvalCheckError(f"marginal -log p(x) violates its bounds: {check}")
    result["bits_per_dim_conditional"] = bits_per_dim(result["nll_conditional"],
                                                      spec_of(config.data.dataset).pixels)
    result["seconds"] = time.perf_counter() - start
    return {"iwae": result}


def samples_per_label(reference_labels, options: EvalOptions, *, num_classes: int) -> int:
    """`samples_per_digit` as given; by default `DEFAULT_SAMPLES`, or fewer where the reference
    half is smaller than that many a label: a Fréchet distance grows as its sets shrink, so the
    samples' and the real halves' are comparable only at about the same size (a small test set
    such as scikit-learn's digits has a half of 180 images)."""
    if options.samples_per_digit is not None:
        return options.samples_per_digit
    return max(2, min(DEFAULT_SAMPLES, len(reference_labels) // num_classes))


def sample_counts(reference_labels, options: EvalOptions, *, num_classes: int) -> np.ndarray:
    """How many samples of each label `cvae eval` scores: num_classes x `samples_per_label`,
    each label's count in the reference's label proportions, so that the samples and the
    reference are drawn from the same p(y) (`fidelity.label_counts_like`); by default as many
    in all as the reference holds, at most `DEFAULT_SAMPLES` a label. `balanced_samples`:
    exactly `samples_per_label` a label."""
    if options.balanced_samples:
        return np.full(num_classes, samples_per_label(reference_labels, options,
                                                      num_classes=num_classes))
    total = (num_classes * options.samples_per_digit if options.samples_per_digit is not None
             else min(len(reference_labels), num_classes * DEFAULT_SAMPLES))  # not rounded down
    return fidelity.label_counts_like(reference_labels, total, num_classes=num_classes)


def eval_samples(sampler, reference_labels, options: EvalOptions):
    """`cvae eval`'s samples (`options.seed`, temperature 1), `sample_counts` of each of the
    sampler's classes. Returns (images f32[N, *stored shape], labels i64[N], counts [C])."""
    classes = len(sampler.classes)
    counts = sample_counts(reference_labels, options, num_classes=classes)
    images = np.concatenate([sampler.sample_images(digit, int(n), options.seed,
                                                   temperature=DEFAULT_TEMPERATURE)
                             for digit, n in enumerate(counts) if n])
    return images, np.repeat(np.arange(classes), counts), counts


def eval_sampler(checkpoint):
    """The sampler `cvae eval` draws and reconstructs with, as the checkpoint's config says:
    blocks of 500 rows."""
    return create_sampler(create_model(checkpoint.config), checkpoint.config,
                          checkpoint.variables, step=checkpoint.step, block_rows=500)


def sample_scores(checkpoint, classifier, *, reference_features, reference_labels,
                  options: EvalOptions, sampler=None) -> dict:
    """The checkpoint's samples (`eval_samples`) scored against the reference; `sampler`: the
    checkpoint's `eval_sampler` where the caller has built it already."""
    sampler = eval_sampler(checkpoint) if sampler is None else sampler
    samples, sample_labels, counts = eval_samples(sampler, reference_labels, options)
    scores = fidelity.score_images(classifier, samples, sample_labels,
                                   reference_features=reference_features,
                                   reference_labels=reference_labels)
    return {**scores, "per_digit": samples_per_label(reference_labels, options,
                                                     num_classes=len(counts)),
            "label_counts": counts.tolist(),
            "temperature": 1.0}


def fidelity_metrics(checkpoint, images_u8, labels, *, options: EvalOptions, classifier,
                     baseline=None, sampler=None) -> dict:
    # Samples and the reference half are compared with the same (odd-indexed) half of the test
    # set, at about the same size, so the Fréchet distances share their small-sample bias.
    _, reference_features = classifier.logits_and_features(images_u8[1::2])
    scored = functools.partial(sample_scores, classifier=classifier,
                               reference_features=reference_features,
                               reference_labels=labels[1::2], options=options)
    result = {"classifier": {"test_accuracy": classifier.test_accuracy, **{
                  k: v for k, v in classifier.meta.items() if k != "test_accuracy"}},
              "samples": scored(checkpoint, sampler=sampler),
              "real": fidelity.reference_scores(classifier, images_u8, labels)}
    if baseline is not None:
        # Scored in the same run (same classifier, reference half and seed), so the ratio is
        # free of run-to-run differences.
        theirs = scored(baseline)
        ratio = result["samples"]["fd"] / theirs["fd"]
        result["baseline"] = {"step": baseline.step, "config": baseline.config.to_dict(),
                              "samples": theirs, "fd_ratio": ratio,
                              "fd_ratio_target": FD_RATIO_TARGET,
                              "fd_ratio_met": bool(ratio <= FD_RATIO_TARGET)}
    return result


def evaluate_checkpoint(checkpoint, data, options: EvalOptions,
                        *, classifier_dir: str | None, baseline=None) -> dict:
    """Every figure for `checkpoint`; `baseline` (another checkpoint) gets its samples scored
    beside ours."""
    limit = options.test_limit or len(data.test_labels)
    images_u8, labels = data.test_images[:limit], np.asarray(data.test_labels[:limit])
    config = checkpoint.config
    results = {"step": checkpoint.step, "config": config.to_dict(),
               "likelihood": config.likelihood.name,
               "latent_dim": noise_dim(config), "test_examples": int(limit),
               "elbo": elbo_metrics(checkpoint, images_u8, labels)}
    results.update(iwae_metrics(checkpoint, images_u8, labels, options=options))
    results.update(classification.classification_metrics(
        checkpoint, images_u8, labels, num_samples=options.iwae_k_marginal, seed=options.seed))
    if options.fidelity:
        classifier = fidelity.load_or_train_classifier(
            data, classifier_dir, log=lambda m: print(m, file=sys.stderr))
        sampler = eval_sampler(checkpoint)  # one for the samples, the swap, the reconstructions
        results["fidelity"] = fidelity_metrics(checkpoint, images_u8, labels, options=options,
                                               classifier=classifier, baseline=baseline,
                                               sampler=sampler)
        swap_omitted = label_swap.omitted_because(spec_of(config.data.dataset))
        if swap_omitted:
            results["label_swap_note"] = swap_omitted
        else:
            results["label_swap"] = label_swap.scores(sampler, classifier, images_u8=images_u8,
                                                      labels=labels, seed=options.seed)
        results["fidelity"]["reconstructions"] = reconstructions.scores(
            sampler, classifier, images_u8=images_u8, labels=labels,
            samples_fd=results["fidelity"]["samples"]["fd"])
    return results


def summary_table(results: dict) -> str:
    """The human-readable summary printed by `cvae eval`."""
    elbo = results["elbo"]
    drawn = results["config"]["drawing"]
    lines = [f"checkpoint step {results['step']}, {results['likelihood']} likelihood, "
             f"{results['test_examples']} test examples; samples drawn at truncation "
             f"{drawn['truncation']!r}, sharpness {drawn['pixel_sharpness']!r}",
             f"  {'reconstruction':<34}{elbo['reconstruction']:>10.2f} nats",
             f"  {'KL':<34}{elbo['kl']:>10.2f} nats",
             f"  {'negative ELBO':<34}{elbo['neg_elbo']:>10.2f} nats"
             f"  ({elbo['bits_per_dim']:.4f} bits/dim)",
             f"  {f'active units (KL > {ACTIVE_UNIT_NATS})':<34}{elbo['active_units']:>7d} / "
             f"{results['latent_dim']}"]
    if results.get("iwae"):
        bound = results["iwae"]
        lines.append(f"  {'-log p(x|y), IWAE K=' + str(bound['k']):<34}"
                     f"{bound['nll_conditional']:>10.2f} nats"
                     f"  ({bound['bits_per_dim_conditional']:.4f} bits/dim)")
        if "nll_marginal" in bound:
            lines.append(f"  {'-log p(x), K=' + str(bound['k']) + '/' + str(bound['k_marginal_other_labels']):<34}"  # noqa: E501
                         f"{bound['nll_marginal']:>10.2f} nats  "
                         f"({bound['bits_per_dim_marginal']:.4f} bits/dim; check "
                         f"{'ok' if bound['marginal_check']['ok'] else 'FAILED'})")
            lines.append(f"  {'argmax_y p(x|y) error, K=' + str(bound['bayes_rule']['k']):<34}"
                         f"{100 * bound['bayes_rule']['error']:>10.2f} %  (Bayes' rule, "
                         f"{bound['examples']} digits)")
    else:
        lines.append(f"  IWAE: skipped ({results.get('iwae_note')})")
    if "classification" in results:
        lines += classification.summary_lines(results["classification"])
    if "fidelity" in results:
        fid = results["fidelity"]
        samples, real = fid["samples"], fid["real"]
        lines += [f"  classifier test accuracy {fid['classifier']['test_accuracy']:.4f}",
                  f"  {'':<14}{'samples':>10}{'real test':>11}",
                  f"  {'accuracy':<14}{samples['accuracy']:>10.4f}{real['accuracy']:>11.4f}",
                  f"  {'Fréchet dist.':<14}{samples['fd']:>10.2f}{real['fd']:>11.2f}",
                  *(f"  {name:<14}{samples[key]:>10.4f}{real[key]:>11.4f}"
                    for name, key in (("precision", "precision"), ("recall", "recall"),
                                      ("coverage", "coverage"), ("grey pixels", "grey_share")))]
        classes = len(samples["accuracy_per_digit"])
        if classes > MAX_CLASS_LINES:
            lines.append(f"  per class ({classes} classes): in the JSON")
        for digit in range(classes if classes <= MAX_CLASS_LINES else 0):
            lines.append(f"  {'  class ' + str(digit):<14}"
                         f"{samples['accuracy_per_digit'][digit]:>10.4f}"
                         f"{real['accuracy_per_digit'][digit]:>11.4f}"
                         f"   FD {samples['fd_per_digit'][digit]:>7.2f}"
                         f"{real['fd_per_digit'][digit]:>8.2f}")
        if "reconstructions" in fid:
            lines.append(reconstructions.summary_line(fid["reconstructions"]))
        if "baseline" in fid:
            base = fid["baseline"]
            lines.append(f"  baseline (step {base['step']}): accuracy "
                         f"{base['samples']['accuracy']:.4f}, Fréchet dist. "
                         f"{base['samples']['fd']:.2f}, recall {base['samples']['recall']:.4f}"
                         f"; ours / baseline FD = "
                         f"{base['fd_ratio']:.3f} (target <= {FD_RATIO_TARGET}: "
                         f"{'met' if base['fd_ratio_met'] else 'NOT met'})")
    if "label_swap" in results:
        lines += label_swap.summary_lines(results["label_swap"])
    elif "label_swap_note" in results:
        lines.append(f"  label swap: omitted ({results['label_swap_note']})")
    if "reports" in results:
        lines.append(f"  reports: {', '.join(results['reports'].values())}")
    return "\n".join(lines)


def _finite(value):
    """JSON has no NaN: write null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def rendered_at(checkpoint, sharpness: float | None, truncation: float | None = None):
    """The checkpoint with its images rendered at `sharpness` and its samples drawn at
    `truncation` (None: as its config says): the weights and every bound are the same, only
    the pictures change."""
    config = checkpoint.config.drawn_at(truncation)
    if sharpness is not None:
        config = config.replace(pixel_sharpness=sharpness)
    return dataclasses.replace(checkpoint, config=config)


def run_eval(checkpoint_dir: str | Path, data_dir: str | Path, options: EvalOptions, *,
             json_path: str | Path | None = None, baseline_dir: str | Path | None = None,
             step: StepChoice = "latest") -> dict:
    """`cvae eval`: score the chosen step (`--step`; the newest by default) of `checkpoint_dir`,
    print the table, write the JSON (and the report PNGs beside it, or in
    `options.report_dir`). Returns the results."""
    if baseline_dir and not options.fidelity:
        raise ConfigError("--baseline-dir: compares sample fidelity, so it cannot go with "
                          "--no-fidelity")
    checkpoint = rendered_at(load_trained_model(checkpoint_dir, step), options.pixel_sharpness,
                             options.truncation)
    data = load_dataset(data_dir, checkpoint.config.data.dataset, checkpoint.config.data.source)
    classifier_dir = options.classifier_dir or str(Path(data_dir) / "classifier")
    baseline = load_trained_model(baseline_dir) if baseline_dir else None
    results = evaluate_checkpoint(checkpoint, data, options, classifier_dir=classifier_dir,
                                  baseline=baseline)
    results["record"] = read_record(checkpoint_dir, checkpoint.step)  # what made the run
    report_dir = options.report_dir or (str(Path(json_path).parent) if json_path else None)
    if report_dir is not None:
        limit = options.test_limit or len(data.test_labels)
        results["reports"] = reports.write_reports(
            create_model(checkpoint.config), checkpoint.variables, config=checkpoint.config,
            images_u8=data.test_images[:limit], labels=data.test_labels[:limit],
            out_dir=report_dir, seed=options.seed)
    print(summary_table(results))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(_finite(results), indent=2, sort_keys=True) + "\n")
    return results
