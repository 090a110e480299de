"""Reconstructions scored like samples: the floor that no prior, and no sampler, can beat.

A sample can be no closer to real digits than the model's own reconstruction of a real digit:
both come out of the same decoder, and the reconstruction is told where the digit's code is.
So `cvae eval` scores reconstructions beside the samples: the test digits of the
even-indexed half, each encoded with its own label (the posterior mean, as `POST /transfer`
encodes an upload) and decoded with that label, read by the fidelity classifier
(`cvae.evaluation.fidelity`) and compared with the odd-indexed half. That is the reference the
samples are compared with and the protocol of the real halves' scores, so the three rows of the
table differ only in what is scored: real digits (the ceiling), reconstructions (the decoder's
floor), samples (the floor plus the prior's share). `fd_ratio` = samples' FD / reconstructions'.
"""

from __future__ import annotations

import numpy as np

from cvae.evaluation import fidelity


def reconstruct(sampler, images_u8: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """uint8[N, *stored_shape], i32[N] -> f32[N, *stored_shape] in [0, 1]: the posterior mean
    with the own label, decoded with it, through the sampler's fixed blocks (as `/transfer`
    does)."""
    labels = np.asarray(labels, np.int32)
    mean, _, _ = sampler.encode(images_u8, labels)
    return sampler.decode_codes(mean, labels)


def scores(sampler, classifier, *, images_u8: np.ndarray, labels: np.ndarray,
           samples_fd: float | None = None) -> dict:
    """Accuracy, FD, precision, recall and coverage of the reconstructions of the even half of
    `images_u8` against the odd half (`fidelity.score_images`' keys), with "digits", and with
    the samples' FD, "fd_ratio" = samples_fd / this FD."""
    labels = np.asarray(labels)
    _, reference_features = classifier.logits_and_features(images_u8[1::2])
    rebuilt = reconstruct(sampler, images_u8[0::2], labels[0::2])
    result = {**fidelity.score_images(classifier, rebuilt, labels[0::2],
                                      reference_features=reference_features,
                                      reference_labels=labels[1::2]),
              "digits": int(len(rebuilt)),
              "protocol": "even-indexed half, own label, posterior mean; vs the odd half"}
    if samples_fd is not None:
        result["fd_ratio"] = samples_fd / max(result["fd"], 1e-12)
    return result


def summary_line(result: dict) -> str:
    """One line for `cvae eval`'s table."""
    line = (f"  reconstructions ({result['digits']} test digits): accuracy "
            f"{result['accuracy']:.4f}, Fréchet dist. {result['fd']:.2f}, precision "
            f"{result['precision']:.4f}, recall {result['recall']:.4f}")
    if "fd_ratio" in result:
        line += f"; samples' FD / theirs = {result['fd_ratio']:.2f}"
    return line
