"""Label swap, scored for `cvae eval`: re-decoded with another label, does a test digit show that
label, in the same hand?

- Accuracy: every test digit x of class a is encoded with its label (the posterior mean z) and
  decoded with each of the nine labels b != a, as `POST /transfer` does it (with a per-class
  prior, z is first carried to b's region: cvae/model/transport.py); the share of those 9N pictures
  the fidelity classifier (`cvae.evaluation.fidelity`) reads as b. Also per target digit, and for
  every pair (a, b); with a per-class prior the same figures without the transport ("direct").
- Style survival: how much of the writer's hand the swap keeps, measured on two properties of
  handwriting that every digit has: slant (the shear MNIST deskewing removes: how far the ink
  moves right per row up) and stroke width (2 x ink area / ink perimeter, ink = pixels >= 0.5).
  Each is standardised within its class (sources within a, over the real test digits; swaps
  within b, over the swaps), which removes what the class alone decides (a 1 is narrower than
  an 8); the figure is Pearson's r between the source's standardised value and its swaps',
  pooled over all pairs. 0 is no style kept: that is what prior samples decoded as b score
  (computed beside it); the own-label reconstruction's r is how much of the property the model
  keeps at all, the ceiling for a swap.
- Reconstruction: mean squared error of the own-label decoding (pixels in [0, 1]).

Why not the distance in the classifier's features to real b digits "of a similar style": the
classifier is trained to read the class whatever the hand, so its features are built to discard
style; a distance in them would say little about it. Slant and width are measured on the
pixels, have units, and come with a floor and a ceiling measured in the same run.
"""

from __future__ import annotations

import jax
import numpy as np

from cvae.data.pixels import to_unit
from cvae.data.specs import DIGITS, DatasetSpec

INK = 0.5  # a pixel is ink at or above this intensity (for stroke width)
ATTRIBUTES = ("slant", "stroke_width")
TARGET_ACCURACY = 0.95  # a swap must read as the new digit this often to be a transfer


def omitted_because(spec: DatasetSpec) -> str | None:
    """Why `scores` does not apply to dataset `spec`, or None where it does: slant and stroke
    width are properties of handwritten digits, and every source is swapped to every other
    class (C - 1 decodings a test image), which only a handful of classes keeps cheap."""
    if spec.class_names != DIGITS or spec.channels != 1:
        return (f"label swap measures the slant and stroke width of handwritten digits; "
                f"{spec.title}'s classes are not the ten grey digits")
    return None


def slant(images: np.ndarray) -> np.ndarray:
    """f[N, 28, 28] in [0, 1] -> f64[N]: columns the ink moves right per row up,
    -cov(row, col) / var(row) over the ink-weighted pixels (positive leans right)."""
    weights = np.asarray(images, np.float64)
    mass = np.maximum(weights.sum(axis=(1, 2)), 1e-9)
    index = np.arange(weights.shape[1], dtype=np.float64)
    row_mean = np.einsum("nij,i->n", weights, index) / mass
    col_mean = np.einsum("nij,j->n", weights, index) / mass
    rows = index[None, :] - row_mean[:, None]
    cols = index[None, :] - col_mean[:, None]
    covariance = np.einsum("nij,ni,nj->n", weights, rows, cols) / mass
    variance = np.einsum("nij,ni->n", weights, rows ** 2) / mass
    return -covariance / np.maximum(variance, 1e-9)


def stroke_width(images: np.ndarray) -> np.ndarray:
    """f[N, 28, 28] in [0, 1] -> f64[N]: 2 x ink area / ink perimeter in px (a stroke of length
    l and width w has area l*w and a perimeter of about 2l)."""
    ink = np.pad(np.asarray(images) >= INK, ((0, 0), (1, 1), (1, 1)))
    area = ink.sum(axis=(1, 2))
    perimeter = (np.diff(ink, axis=1) != 0).sum(axis=(1, 2)) + \
        (np.diff(ink, axis=2) != 0).sum(axis=(1, 2))
    return 2.0 * area / np.maximum(perimeter, 1)


def standardised(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each value as a z-score within its class."""
    out = np.zeros_like(values, dtype=np.float64)
    for digit in np.unique(labels):  # the classes present: no class count needed
        members = labels == digit
        if members.sum() > 1:
            chosen = values[members]
            out[members] = (chosen - chosen.mean()) / max(chosen.std(), 1e-9)
    return out


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r; NaN when either side does not vary (nothing to correlate)."""
    if np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def measure(images: np.ndarray) -> dict[str, np.ndarray]:
    return {"slant": slant(images), "stroke_width": stroke_width(images)}


def scores(sampler, classifier, *, images_u8: np.ndarray, labels: np.ndarray,
           seed: int = 0) -> dict:
    """Every figure of the module docstring for the test digits `images_u8` (uint8[N, h, w]).

    The swaps are made as `POST /transfer` makes them (`sampler.swap`: carried to the target
    class's region when the prior differs per class); with such a prior, "direct" also scores
    the codes decoded as they are, for comparison.
    """
    labels = np.asarray(labels, np.int32)
    count = len(labels)
    mean, _, _ = sampler.encode(images_u8, labels)
    classes = len(sampler.classes)  # the model's dataset's
    shifts = np.arange(1, classes)
    targets = ((labels[:, None] + shifts[None, :]) % classes).reshape(-1).astype(np.int32)
    sources = np.repeat(labels, len(shifts))
    codes = np.repeat(mean, len(shifts), axis=0)
    own = sampler.decode_codes(mean, labels)
    # Floor: a prior sample for each source, decoded as one of its targets.
    floor_targets = targets.reshape(count, -1)[np.arange(count), np.arange(count) % len(shifts)]
    noise = np.asarray(jax.random.normal(jax.random.key(seed), (count, sampler.noise_dim)))
    prior = sampler.decode(noise, floor_targets)
    real = to_unit(images_u8)
    source_style = {name: standardised(values, labels) for name, values in measure(real).items()}
    references = {
        name: {"reconstruction_r": correlation(source_style[name],
                                               standardised(values, labels)),
               "prior_sample_r": correlation(source_style[name],
                                             standardised(measure(prior)[name], floor_targets))}
        for name, values in measure(own).items()}

    def scored(swapped: np.ndarray) -> dict:
        logits, _ = classifier.logits_and_features(swapped)
        correct = logits.argmax(axis=1) == targets
        pairs = np.full((classes, classes), np.nan)
        for a in range(classes):
            for b in range(classes):
                members = (sources == a) & (targets == b)
                if members.any():
                    pairs[a, b] = correct[members].mean()
        worst = np.unravel_index(np.nanargmin(pairs), pairs.shape)
        style = {name: {"swap_r": correlation(np.repeat(source_style[name], len(shifts)),
                                              standardised(values, targets)),
                        **references[name]}
                 for name, values in measure(swapped).items()}
        return {
            "accuracy": float(correct.mean()),
            "accuracy_per_target": [float(correct[targets == b].mean())
                                    for b in range(classes)],
            "accuracy_pairs": [[None if np.isnan(v) else float(v) for v in row]
                               for row in pairs],
            "worst_pair": {"from": int(worst[0]), "to": int(worst[1]),
                           "accuracy": float(pairs[worst])},
            "target": TARGET_ACCURACY, "target_met": bool(correct.mean() >= TARGET_ACCURACY),
            "style": style}

    result = {"digits": count, "swaps": int(len(targets)),
              **scored(sampler.decode_codes(sampler.swap(codes, sources, targets), targets)),
              "reconstruction_mse": float(np.mean((own - real) ** 2)),
              "transport": getattr(sampler, "class_transport", lambda: None)() is not None}
    if result["transport"]:
        result["direct"] = scored(sampler.decode_codes(codes, targets))
    return result


def summary_lines(swap: dict) -> list[str]:
    """Lines for `cvae eval`'s table."""
    worst = swap["worst_pair"]
    lines = [f"  label swap ({swap['digits']} digits x 9 labels): "
             f"{swap['accuracy']:.4f} read as the new label (target >= {swap['target']}: "
             f"{'met' if swap['target_met'] else 'NOT met'}); worst pair "
             f"{worst['from']}->{worst['to']} {worst['accuracy']:.4f}",
             f"  {'style survival r':<22}{'swap':>8}{'own label':>11}{'prior':>8}"]
    for name, r in swap["style"].items():
        lines.append(f"  {'  ' + name:<22}{r['swap_r']:>8.3f}{r['reconstruction_r']:>11.3f}"
                     f"{r['prior_sample_r']:>8.3f}")
    if "direct" in swap:
        direct = swap["direct"]
        lines.append(f"  without the class transport: {direct['accuracy']:.4f} read as the new "
                     f"label; style r slant {direct['style']['slant']['swap_r']:.3f}, stroke "
                     f"width {direct['style']['stroke_width']['swap_r']:.3f}")
    lines.append(f"  {'own-label reconstruction MSE':<34}{swap['reconstruction_mse']:>10.4f}")
    return lines
