"""The per-class mixture prior: EM recovers a known mixture, sampling follows the weights at any
temperature, the density is exact, and the standard prior leaves old models unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

from cvae.config import presets
from cvae.evaluation import iwae
from cvae.model import prior
from cvae.training.callbacks import Checkpointer
from cvae.training.checkpoints import load_checkpoint
from cvae.training.loop import train_and_evaluate
from cvae.model.registry import create_model, init_variables
from cvae.sampling.sampler import load_sampler
from cvae.data.synthetic import synthetic_dataset, synthetic_images

MEANS = np.array([[-4.0, 0.0], [4.0, 1.0]])
COVS = np.array([[[1.0, 0.5], [0.5, 1.0]], [[0.5, 0.0], [0.0, 2.0]]])
WEIGHTS = np.array([0.3, 0.7])


def known_mixture(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    component = rng.choice(2, size=n, p=WEIGHTS)
    return np.stack([rng.multivariate_normal(MEANS[c], COVS[c]) for c in component])


def as_prior(weights, means, covs, num_classes: int = 1) -> dict:
    """A mixture dict for `num_classes` identical classes."""
    tile = lambda a: jnp.asarray(np.broadcast_to(a, (num_classes, *np.shape(a))), jnp.float32)  # noqa: E731
    return {"weights": tile(weights), "means": tile(means),
            "scale_tril": tile(np.linalg.cholesky(covs))}


def test_em_recovers_a_known_mixture_per_class():
    codes = np.concatenate([known_mixture(3000, seed=0), known_mixture(3000, seed=1) + 20.0])
    labels = np.repeat([0, 1], 3000)
    table, mask = prior.class_index_table(labels, 2)
    fitted = prior.fit(jnp.asarray(codes, jnp.float32), table, mask, jax.random.key(0),
                       components=2)
    for c, shift in ((0, 0.0), (1, 20.0)):
        order = np.argsort(np.asarray(fitted["means"][c, :, 0]))  # components come in any order
        np.testing.assert_allclose(np.asarray(fitted["weights"][c])[order], WEIGHTS, atol=0.03)
        np.testing.assert_allclose(np.asarray(fitted["means"][c])[order], MEANS + shift,
                                   atol=0.15)
        tril = np.asarray(fitted["scale_tril"][c])[order]
        np.testing.assert_allclose(tril @ np.swapaxes(tril, 1, 2), COVS, atol=0.2)


def posteriors(num_classes: int, per_class: int, seed: int = 0):
    """Diagonal Gaussian posteriors of a model that uses 2 of its 8 latent dimensions: means
    spread in those two (posterior variance 0.01), at 0 in the other six (variance 1, the
    prior's), as a briefly trained or wide-latent model's are. -> (means, variances, labels)."""
    rng = np.random.default_rng(seed)
    n = num_classes * per_class
    means = np.zeros((n, 8), np.float32)
    means[:, :2] = rng.normal(0.0, 2.0, (n, 2))
    variances = np.full((n, 8), 1.0, np.float32)
    variances[:, :2] = 0.01
    return means, variances, np.repeat(np.arange(num_classes), per_class)


def principal_variances(fitted: dict) -> np.ndarray:
    """Each component's covariance eigenvalues, [K, C, L]."""
    tril = np.asarray(fitted["scale_tril"], np.float64)
    return np.linalg.eigvalsh(tril @ np.swapaxes(tril, -1, -2))


def test_posterior_means_are_floored_by_their_posterior_variance_in_every_direction():
    """Fitted to posterior means, the unused dimensions' variance collapses to the 1e-4 floor:
    a posterior draw there scores log N(1; 0, 1e-4) per dimension, thousands of nats off.
    With the variances, every principal variance is at least the posterior's along it, and
    the draws score within a few nats of the aggregate posterior's own density."""
    means, variances, labels = posteriors(2, 200)
    table, mask = prior.class_index_table(labels, 2)
    args = (jnp.asarray(means), table, mask, jax.random.key(0))
    bare = prior.fit(*args, components=3)
    floored = prior.fit(*args, components=3, variances=jnp.asarray(variances),
                        codes_are_draws=False)
    assert principal_variances(bare).min() < 1e-3
    assert principal_variances(floored).min() >= 0.01 * (1 - 1e-4)
    rng = np.random.default_rng(1)
    draws = jnp.asarray(means + np.sqrt(variances) * rng.standard_normal(means.shape),
                        jnp.float32)
    # The aggregate posterior per class, mean_n N(mean_n, var_n), scored exactly:
    same = labels[:, None] == labels[None, :]  # [draw, posterior]
    log_normals = -0.5 * np.sum(np.log(2 * np.pi * variances)[None]
                                + np.square(np.asarray(draws)[:, None] - means[None])
                                / variances[None], axis=-1)
    aggregate = np.log(np.sum(np.where(same, np.exp(log_normals), 0.0), axis=1) / same.sum(1))
    scored = np.asarray(prior.log_density(floored, draws, jnp.asarray(labels)))
    assert np.mean(prior.log_density(bare, draws, jnp.asarray(labels))) < -1000
    assert np.mean(scored) > np.mean(aggregate) - 3.0, (np.mean(scored), np.mean(aggregate))


def test_draws_keep_their_own_spread_unless_a_class_is_too_small_to_fit_it():
    """Fitted to posterior draws, a class of at least 2 codes a dimension fits exactly what it
    fitted without the variances (bit for bit: the default's and the likelihood preset's fitted
    priors do not change); a class of fewer codes than dimensions spans only part of them, and
    is floored in the rest."""
    means, variances, labels = posteriors(2, 400)
    rng = np.random.default_rng(2)
    draws = jnp.asarray(means + np.sqrt(variances) * rng.standard_normal(means.shape),
                        jnp.float32)
    keep = (labels == 0) | (np.arange(len(labels)) % 400 < 6)  # class 1: 6 codes, 8 dimensions
    table, mask = prior.class_index_table(labels[keep], 2)
    args = (draws[keep], table, mask, jax.random.key(0))
    bare = prior.fit(*args, components=3)
    floored = prior.fit(*args, components=3, variances=jnp.asarray(variances[keep]),
                        codes_are_draws=True)
    for name in ("weights", "means", "scale_tril"):
        np.testing.assert_array_equal(floored[name][0], bare[name][0])
    assert principal_variances(bare)[1].min() < 1e-3  # 6 points span 5 of 8 directions
    fitted = np.asarray(floored["weights"][1]) > 0  # the components the small class fits
    assert principal_variances(floored)[1][fitted].min() >= 0.01 * (1 - 1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampling_picks_components_by_weight_at_any_temperature(temperature):
    mixture = as_prior(WEIGHTS, np.array([[-100.0, 0.0], [100.0, 0.0]]), COVS)
    noise = temperature * jax.random.normal(jax.random.key(1), (20000, 2))
    z = np.asarray(prior.sample(mixture, noise, jnp.zeros(20000, jnp.int32)))
    assert np.mean(z[:, 0] > 0) == pytest.approx(WEIGHTS[1], abs=0.015)


def test_samples_have_each_components_mean_and_covariance():
    mixture = as_prior(WEIGHTS, MEANS * 10, COVS)
    noise = jax.random.normal(jax.random.key(2), (40000, 2))
    z = np.asarray(prior.sample(mixture, noise, jnp.zeros(40000, jnp.int32)))
    for c in range(2):
        mine = z[(z[:, 0] > 0) == bool(c)]
        np.testing.assert_allclose(mine.mean(axis=0), MEANS[c] * 10, atol=0.05)
        np.testing.assert_allclose(np.cov(mine, rowvar=False), COVS[c], atol=0.06)


def test_log_density_is_the_mixture_density():
    mixture = as_prior(WEIGHTS, MEANS, COVS, num_classes=3)
    z = known_mixture(5, seed=3)
    expected = np.log(sum(w * multivariate_normal(m, s).pdf(z)
                          for w, m, s in zip(WEIGHTS, MEANS, COVS)))
    got = prior.log_density(mixture, jnp.asarray(z, jnp.float32), jnp.full(5, 2, jnp.int32))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)


def test_the_unfitted_mixture_is_the_standard_prior():
    config = presets.test().replace(prior="mixture", prior_components=3)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    standard = create_model(config.replace(prior="standard"))
    plain = {"params": variables["params"]}
    noise = jax.random.normal(jax.random.key(1), (6, config.model.options.latent_dim))
    labels = jnp.arange(6)
    np.testing.assert_allclose(
        model.apply(variables, noise, labels, sampling=True, method="log_prior"),
        standard.apply(plain, noise, labels, sampling=True, method="log_prior"), rtol=1e-5)
    np.testing.assert_allclose(model.apply(variables, noise, labels, method="generate"),
                               standard.apply(plain, noise, labels, method="generate"),
                               rtol=1e-5, atol=1e-5)


def test_standard_prior_generates_exactly_what_decode_does():
    """Models without a mixture (all checkpoints before it) sample the same pixels as before."""
    config = presets.test()
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    assert set(variables) == {"params"}
    noise = jax.random.normal(jax.random.key(1), (4, config.model.options.latent_dim))
    labels = jnp.arange(4)
    np.testing.assert_array_equal(model.apply(variables, noise, labels, method="generate"),
                                  model.apply(variables, noise, labels, method="decode"))


@pytest.mark.parametrize("codes", ["samples", "means"])
def test_a_run_with_the_mixture_prior_stores_and_samples_from_it(tmp_path, codes):
    config = presets.test().replace(epochs=2, prior="mixture", prior_components=2,
                                       prior_codes=codes)
    train_and_evaluate(config, synthetic_dataset(80), tmp_path, callbacks=[Checkpointer()])
    mixture = load_checkpoint(tmp_path).state.prior[prior.VARIABLE]
    assert mixture["means"].shape == (10, 2, config.model.options.latent_dim)
    assert np.any(np.asarray(mixture["means"]) != 0)  # fitted, not the initial N(0, I)
    np.testing.assert_allclose(np.asarray(mixture["weights"]).sum(axis=1), 1.0, rtol=1e-5)
    images = load_sampler(tmp_path).sample_images(None, 3, seed=0)
    assert images.shape == (30, 28, 28) and np.all(np.isfinite(images))


def test_iwae_bound_uses_the_models_prior():
    """Same weights: the unfitted mixture gives the standard prior's bound; a mixture that
    puts p(z|y) far from the codes gives a much lower one."""
    config = presets.test().replace(prior="mixture", prior_components=2)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    labels = np.arange(8, dtype=np.int32)
    x = iwae.binarize_levels(jax.random.key(1), synthetic_images(labels).reshape(-1, 784))
    key, y = jax.random.key(2), jnp.asarray(labels)
    mixed = iwae.create_iwae_fn(model, 4)(variables, x, y, key)
    standard = iwae.create_iwae_fn(create_model(config.replace(prior="standard")),
                                   4)({"params": variables["params"]}, x, y, key)
    np.testing.assert_allclose(mixed, standard, rtol=1e-5)
    far = jax.tree.map(lambda a: a, variables)
    far["prior"][prior.VARIABLE]["means"] = far["prior"][prior.VARIABLE]["means"] + 10.0
    assert np.all(np.asarray(iwae.create_iwae_fn(model, 4)(far, x, y, key))
                  < np.asarray(standard) - 50)
