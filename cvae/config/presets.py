"""The presets: named configs, each a function whose docstring gives its command and what to
expect. `cvae train --preset NAME` starts from one; every flag then overrides a field of it."""

from __future__ import annotations

from typing import Any

from cvae.config.sections import Config
from cvae.errors import ConfigError

# As the presets below were measured: the source's 10,000 validation digits, evaluated each epoch.
SPLIT_50K: dict[str, Any] = {"validation_size": 10000, "eval_every": 1}
# The sampler as the presets below were measured: drawn untruncated, and where the prior is the
# fitted mixture, 10 a class (the default fits 30 a class to posterior draws and truncates
# them: docs/model.md).
UNTRUNCATED: dict[str, Any] = {"truncation": 1.0}
MIXTURE_10: dict[str, Any] = {"prior_components": 10, **UNTRUNCATED}


def default() -> Config:
    """`make train` (= `cvae train`): MLP 784-512-256 -> 16 latent, the label at every decoder
    layer, Bernoulli likelihood, beta 1, a per-class mixture prior fitted to posterior draws (30
    a class), 140 epochs on 59,000 digits, evaluated every 10, images rendered at sharpness 1.3
    and drawn truncated at 0.75: about 4 minutes on 2 CPU cores (docs/training.md says why
    each; the measured figures are in docs/evaluation.md and docs/model.md)."""
    return Config()


def seed() -> Config:
    """`cvae train --preset seed`: the baseline setup, kept for comparison. MLP 784-256-128-64,
    latent 32, summed MSE (`optax.l2_loss`) Gaussian likelihood, kl_weight 0.5, adamw lr 1e-4
    (constant), batch 16, ReLU. Samples are recognisable but blurry."""
    return Config().replace(
        hidden_sizes=(256, 128, 64), latent_dim=32, activation="relu", likelihood="gaussian",
        kl_weight=0.5, optimizer="adamw", learning_rate=1e-4, end_learning_rate=1e-4,
        lr_schedule="constant", warmup_steps=0, weight_decay=1e-4, batch_size=16, epochs=10,
        label_conditioning="first", prior="standard", pixel_sharpness=1.0, **SPLIT_50K,
        **UNTRUNCATED)


def likelihood() -> Config:
    """`make likelihood`'s first stage (30 minutes on 2 cores with the second): the default but
    MLP 784-512-512 -> 32 latent, the mixture fitted to posterior draws, 640 epochs, rendered at
    sharpness 1.2 (its samples' share of grey pixels is the real digits' there; model.md)."""
    return Config().replace(hidden_sizes=(512, 512), latent_dim=32, prior_codes="samples",
                            epochs=640, pixel_sharpness=1.2, **MIXTURE_10)


def likelihood_dreg() -> Config:
    """`--preset likelihood-dreg --init-from <a likelihood run>`: its second stage, 20 epochs of
    the importance-weighted bound (DReG, K = 5) at a tenth of the learning rate."""
    return likelihood().replace(objective="dreg", importance_samples=5, learning_rate=1e-4,
                                epochs=20)


def conv() -> Config:
    """`cvae train --preset conv`, for a GPU: the default with the convolutional encoder and
    decoder, 100 epochs. Better bounds, sample accuracy and FD than the default (docs/results.md):
    81 s on one H200, about 40 minutes on 2 CPU cores, where a convolution costs many times a
    matrix product."""
    return Config().replace(architecture="conv", epochs=100)


def semi() -> Config:
    """`make semi` (= `cvae train --preset semi --checkpoint-dir checkpoints-semi`): the default
    model trained semi-supervised (Kingma et al. 2014, M2) with 100 labelled digits, 10 a class,
    and the rest of the 50,000 without their labels; q(y|x) reads shifted digits, is held
    consistent across two shifts of each unlabelled one, is trained virtual-adversarially
    (weight 3, offsets of length 2) and pulled to decisions (entropy minimisation). 15 epochs;
    docs/semi-supervised.md gives the test error, the time and what each setting bought."""
    return Config().replace(
        labels="100", classifier_weight=5.0, classifier_shift=2, consistency_weight=20.0,
        vat_weight=3.0, vat_epsilon=2.0, entropy_weight=1.0, epochs=15, pixel_sharpness=1.0,
        prior_codes="means", **SPLIT_50K, **MIXTURE_10)


def test() -> Config:
    """A CPU-seconds config for tests: tiny MLP, few steps."""
    return Config().replace(
        hidden_sizes=(32,), latent_dim=4, batch_size=16, epochs=1, warmup_steps=0,
        lr_schedule="constant", steps_per_call=4, eval_batch_size=64, validation_size=16,
        eval_every=1, kl_weight=4.0, label_conditioning="first", prior="standard",
        **UNTRUNCATED)


test.__test__ = False  # a preset, not a pytest test, wherever it is imported

PRESETS = {"default": default, "seed": seed, "likelihood": likelihood,
           "likelihood-dreg": likelihood_dreg, "conv": conv, "semi": semi, "test": test}


def get_preset(name: str) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r}: allowed {', '.join(PRESETS)}")
    return PRESETS[name]()
