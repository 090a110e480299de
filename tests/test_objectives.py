"""Importance-weighted objectives on a Gaussian toy where everything is known in closed form,
through the training path itself (`objectives.row_terms` on a toy family): the bound, its
gradient for the model (exactly IWAE's), DReG's gradient for the encoder (its formula, unbiased,
zero at the true posterior), and Bayes-rule classification (each model's own log weights, the
one-latent family's and the ladder's).

The toy (Rainforth et al. 2018; Tucker et al. 2019): p(z) = N(mu, I), p(x | z) = N(z, I), so
p(x) = N(mu, 2I) and the posterior is N((x + mu) / 2, I / 2); q(z | x) = N(m, diag(exp(v)))
with free m, v per example. Encoder parameters phi = (m, v), model parameters theta = mu.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.config import presets
from cvae.evaluation import iwae as iwae_eval
from cvae.model import densities
from cvae.model import objectives as obj
from cvae.model.interface import sampled_terms
from cvae.model.registry import create_model, init_variables

D = 3
X = jnp.array([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5]])  # B = 2 examples


class Toy(nn.Module):
    """The toy as a family: what `objectives.row_terms` and DReG's two paths call (`draws`,
    `score`, `terms`, `noise_dim`). Parameters: q_mean, q_logvar f32[B, D] (phi), mu f32[D]
    (theta); the images are X."""

    noise_dim = D

    def setup(self):
        self.q_mean = self.param("q_mean", nn.initializers.zeros, X.shape)
        self.q_logvar = self.param("q_logvar", nn.initializers.zeros, X.shape)
        self.mu = self.param("mu", nn.initializers.zeros, (D,))

    def draws(self, images, labels, noise, *, train=False):
        return self.q_mean + jnp.exp(0.5 * self.q_logvar) * noise

    def score(self, images, labels, z, *, train=False, sampling_prior=False):
        zeros = jnp.zeros_like(z)
        return sampled_terms(densities.gaussian_log_density(images, z, zeros),
                             densities.gaussian_log_density(z, self.mu, zeros),
                             densities.gaussian_log_density(z, self.q_mean, self.q_logvar))

    def terms(self, images, labels, noise, *, train=False, sampling_prior=False):
        return self.score(images, labels, self.draws(images, labels, noise))


TOY = Toy()


def toy_params(mu=(0.2, -0.3, 0.1), m=None, v=None) -> dict:
    mu = jnp.asarray(mu, jnp.float32)
    m = jnp.asarray(m if m is not None else X * 0.3, jnp.float32)
    v = jnp.asarray(v if v is not None else jnp.full(X.shape, -0.4), jnp.float32)
    return {"q_mean": m, "q_logvar": v, "mu": mu}


def posterior_params(mu=(0.2, -0.3, 0.1)) -> dict:
    mu = jnp.asarray(mu, jnp.float32)
    return toy_params(mu, (X + mu) / 2, jnp.full(X.shape, math.log(0.5)))


@jax.jit  # run op by op, each shape of the toy compiled dozens of small programs
def toy_log_weights(params, noise):
    """log w f32[K, B] of the toy for noise f32[K, B, D], every gradient path open."""
    return obj.log_weights(TOY.apply({"params": params}, X, None, noise, method="terms"))


@functools.partial(jax.jit, static_argnames="objective")
def toy_rows(params, noise, objective):
    rows, _, _ = obj.row_terms(TOY, {"params": params}, images=X, labels=None, noise=noise,
                               objective=objective, kl_weight=1.0)
    return rows


@jax.jit  # eager, each op compiled on its own
def toy_elbo(params):
    """The toy's ELBO f32[B] in closed form: E_q[log N(x; z, I)] + E_q[log N(z; mu, I)] + H(q)."""
    m, var, mu = params["q_mean"], jnp.exp(params["q_logvar"]), params["mu"]
    return (-0.5 * jnp.sum(math.log(2 * math.pi) + jnp.square(X - m) + var, axis=-1)
            - 0.5 * jnp.sum(math.log(2 * math.pi) + jnp.square(m - mu) + var, axis=-1)
            + 0.5 * jnp.sum(math.log(2 * math.pi) + 1.0 + params["q_logvar"], axis=-1))


@jax.jit  # eager, each op compiled on its own (the vmap too)
def mean_toy_bound(params, noise):
    """The mean IWAE bound of the toy over runs of noise f32[runs, K, B, D]."""
    return jnp.mean(jax.vmap(lambda n: obj.iwae_bound(toy_log_weights(params, n)))(noise))


def iwae_value(params, noise):
    return -toy_rows(params, noise, "iwae").neg_bound.sum()


def dreg_value(params, noise):
    return -toy_rows(params, noise, "dreg").neg_bound.sum()


def log_evidence(mu) -> np.ndarray:
    """log N(x; mu, 2I) per example: the exact log p(x)."""
    return np.asarray(densities.gaussian_log_density(X, jnp.asarray(mu),
                                                     jnp.full(D, math.log(2.0))))


def normals(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape)


def noise_of(seed: int, k: int) -> jax.Array:
    """The toy's draws: f32[K, B, D]."""
    return normals(seed, (k, X.shape[0], D))


def test_k1_bound_is_the_single_sample_elbo_and_averages_to_the_analytic_elbo():
    params = toy_params()
    log_w = toy_log_weights(params, noise_of(0, 1))
    np.testing.assert_array_equal(obj.iwae_bound(log_w), log_w[0])
    # The ELBO row (its KL sampled: the toy has no closed form) is the same single draw.
    np.testing.assert_allclose(toy_rows(params, noise_of(0, 1), "elbo").bound, log_w[0],
                               rtol=1e-6)
    # The mean of 40,000 single-sample bounds is the ELBO in closed form.
    many = toy_log_weights(params, noise_of(1, 40000))
    elbo = toy_elbo(params)
    error = 4 * np.asarray(many.std(axis=0)) / math.sqrt(40000)
    assert np.all(np.abs(np.asarray(many.mean(axis=0) - elbo)) <= error)


@pytest.mark.parametrize("k", [1, 7])
def test_bound_is_exact_at_the_true_posterior_for_any_k(k):
    """With q the true posterior every weight is p(x): the bound is log p(x), draw by draw."""
    params = posterior_params()
    bound = obj.iwae_bound(toy_log_weights(params, noise_of(2, k)))
    np.testing.assert_allclose(bound, log_evidence(params["mu"]), rtol=1e-5)
    for objective in ("iwae", "dreg"):
        np.testing.assert_allclose(toy_rows(params, noise_of(2, k), objective).bound,
                                   log_evidence(params["mu"]), rtol=1e-5)


def test_bound_tightens_with_k_towards_log_evidence():
    params = toy_params()
    means = [float(mean_toy_bound(params, noise_of(3, 2000 * k).reshape(2000, k, 2, D)))
             for k in (1, 4, 16)]
    assert means[0] < means[1] < means[2] < float(log_evidence(params["mu"]).mean())


def test_dreg_value_is_the_iwae_bound():
    noise = noise_of(4, 5)
    np.testing.assert_allclose(dreg_value(toy_params(), noise), iwae_value(toy_params(), noise),
                               rtol=1e-6)


def test_dreg_model_gradient_is_exactly_the_iwae_gradient():
    noise = noise_of(5, 5)
    dreg = jax.grad(dreg_value)(toy_params(), noise)["mu"]
    plain = jax.grad(iwae_value)(toy_params(), noise)["mu"]
    np.testing.assert_allclose(dreg, plain, rtol=1e-6, atol=1e-7)


def test_iwae_model_gradient_matches_finite_differences():
    """z does not depend on mu, so with the noise fixed the bound is a smooth function of mu."""
    noise, mu, step = noise_of(6, 5), np.array([0.2, -0.3, 0.1]), 1e-2
    grad = np.asarray(jax.grad(iwae_value)(toy_params(mu), noise)["mu"])
    for i in range(D):
        shift = np.eye(D)[i] * step
        numeric = (iwae_value(toy_params(mu + shift), noise)
                   - iwae_value(toy_params(mu - shift), noise)) / (2 * step)
        assert grad[i] == pytest.approx(float(numeric), rel=1e-3, abs=1e-4)


def test_dreg_encoder_gradient_is_tuckers_formula():
    """sum_k w~_k^2 d log w_k / d z_k d z_k / d phi, written out by hand for the toy:
    d log w / d z = -(z - mu) + (x - z) + (z - m) / sigma^2, dz/dm = 1, dz/dv = sigma eps / 2."""
    params, noise = toy_params(), noise_of(7, 6)
    grads = jax.grad(dreg_value)(params, noise)
    m, v, mu = (np.asarray(a, np.float64) for a in (params["q_mean"], params["q_logvar"],
                                                   params["mu"]))
    eps, x, sigma = np.asarray(noise, np.float64), np.asarray(X, np.float64), np.exp(0.5 * v)
    z = m + sigma * eps
    log_w = (-0.5 * np.sum(np.square(z - mu) + np.square(x - z) - np.square(eps) - v, axis=-1)
             - 0.5 * D * math.log(2 * math.pi))
    w = np.exp(log_w - log_w.max(axis=0))
    w /= w.sum(axis=0)
    dlogw_dz = -(z - mu) + (x - z) + (z - m) / sigma ** 2
    np.testing.assert_allclose(grads["q_mean"], np.sum(w[..., None] ** 2 * dlogw_dz, axis=0),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["q_logvar"],
                               np.sum(w[..., None] ** 2 * dlogw_dz * 0.5 * sigma * eps, axis=0),
                               rtol=1e-4, atol=1e-6)


def test_dreg_encoder_gradient_is_zero_at_the_true_posterior_where_iwaes_is_noise():
    params, noise = posterior_params(), noise_of(8, 5)
    dreg = jax.grad(dreg_value)(params, noise)
    plain = jax.grad(iwae_value)(params, noise)
    np.testing.assert_allclose(dreg["q_mean"], 0.0, atol=1e-5)
    np.testing.assert_allclose(dreg["q_logvar"], 0.0, atol=1e-5)
    assert float(jnp.abs(plain["q_logvar"]).max()) > 0.01  # the score term: zero only on average


def test_dreg_and_iwae_encoder_gradients_agree_on_average_and_dreg_varies_less():
    params, k, runs = toy_params(), 8, 20000
    noise = noise_of(9, runs * k).reshape(runs, k, X.shape[0], D)
    dreg = jax.vmap(lambda n: jax.grad(dreg_value)(params, n)["q_mean"])(noise)
    plain = jax.vmap(lambda n: jax.grad(iwae_value)(params, n)["q_mean"])(noise)
    difference = np.asarray(dreg - plain, np.float64)
    error = 4 * difference.std(axis=0) / math.sqrt(runs)
    assert np.all(np.abs(difference.mean(axis=0)) <= error)
    assert np.all(np.asarray(dreg).var(axis=0) < np.asarray(plain).var(axis=0))


# ---- Bayes' rule --------------------------------------------------------------------------

CENTRES = jnp.asarray(np.random.default_rng(0).normal(0.0, 3.0, (10, D)), jnp.float32)


def conditional_toy_log_weights(images, labels, noise):
    """p(z) = N(0, I), p(x | z, y) = N(z + c_y, I), q(z | x, y) its exact posterior
    N((x - c_y) / 2, I / 2): every weight is p(x | y) = N(x; c_y, 2I)."""
    centre = CENTRES[labels]
    logvar = jnp.full_like(images, math.log(0.5))
    z = (images - centre) / 2 + jnp.exp(0.5 * logvar) * noise
    return (densities.gaussian_log_density(z, 0.0, jnp.zeros_like(z))
            + densities.gaussian_log_density(images, z + centre, jnp.zeros_like(z))
            - densities.gaussian_log_density(z, (images - centre) / 2, logvar))


@jax.jit  # eager, each op compiled on its own
def conditional_toy_bounds(images, noise):
    return obj.per_label_bounds(conditional_toy_log_weights, images, noise, num_classes=10)


def test_per_label_bounds_are_each_labels_evidence_and_bayes_picks_the_nearest_centre():
    images = CENTRES[jnp.array([3, 7, 0, 9])] + 0.3
    bounds = conditional_toy_bounds(images, normals(10, (4, 4, D)))
    exact = densities.gaussian_log_density(images[:, None, :], CENTRES[None], math.log(2.0))
    np.testing.assert_allclose(bounds, exact, rtol=1e-5)
    labels, probabilities = obj.bayes_classify(bounds)
    nearest = jnp.argmin(jnp.sum(jnp.square(images[:, None] - CENTRES[None]), -1), axis=-1)
    np.testing.assert_array_equal(labels, nearest)
    np.testing.assert_array_equal(labels, [3, 7, 0, 9])
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-6)


@functools.partial(jax.jit, static_argnames="model")
def model_log_weights(model, variables, images, labels, noise):
    """`obj.sampling_log_weights_fn`'s log w, jitted (eager, each op compiled on its own)."""
    return obj.sampling_log_weights_fn(model, variables)(images, labels, noise)


# `cvae eval`'s log weights, jitted (eager, each op compiled on its own)
eval_log_weights = jax.jit(iwae_eval.log_weights, static_argnames="model")


@functools.partial(jax.jit, static_argnames=("model", "num_classes"))
def model_bounds(model, variables, images, noise, num_classes):
    """`obj.per_label_bounds` of the model's own log weights, jitted (eager, each op compiled
    on its own)."""
    return obj.per_label_bounds(obj.sampling_log_weights_fn(model, variables), images, noise,
                                num_classes=num_classes)


@functools.partial(jax.jit, static_argnames="model")  # eager, each op compiled on its own
def by_hand_log_weights(model, variables, images, labels, noise):
    """log w f32[K, B] of a one-latent model under the standard prior, written out from its
    encoder and decoder: log p(x|z,y) + log N(z; 0, I) - log q(z|x,y)."""
    mean, logvar = model.apply(variables, images, labels, method="encode")
    z = mean + jnp.exp(0.5 * logvar) * noise
    k, b = noise.shape[:2]
    logits = model.apply(variables, z.reshape(k * b, -1), jnp.tile(labels, k), method="decode")
    log_px = -densities.reconstruction(logits, jnp.tile(images, (k, 1)), "bernoulli")
    return (log_px.reshape(k, b) + densities.standard_log_density(z)
            - densities.gaussian_log_density(z, mean, logvar))


@pytest.fixture(scope="module")
def tiny_cvae():
    config = presets.test()
    model = create_model(config)
    variables = init_variables(model, jax.random.key(1))
    x = jax.random.bernoulli(jax.random.key(2), 0.3, (6, 784)).astype(jnp.float32)
    return model, variables, x, jnp.arange(6, dtype=jnp.int32) % 10, config.model.options.latent_dim


def test_model_log_weights_are_the_evaluations(tiny_cvae):
    """The same draws give `cvae eval`'s own log weights (cvae/evaluation/iwae.py), and both
    are the log weights written out by hand."""
    model, variables, x, y, latent_dim = tiny_cvae
    key, indices = jax.random.key(3), jnp.arange(4)
    noise = jax.vmap(lambda i: iwae_eval.sample_noise(key, i, (6, latent_dim)))(indices)
    ours = model_log_weights(model, variables, x, y, noise)
    theirs = eval_log_weights(model, variables, images=x, labels=y, key=key, indices=indices)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ours, by_hand_log_weights(model, variables, x, y, noise),
                               rtol=1e-5, atol=1e-4)


def test_one_batched_pass_equals_ten_passes_of_one_label(tiny_cvae):
    model, variables, x, _, latent_dim = tiny_cvae
    noise = normals(11, (3, 6, latent_dim))
    log_weights_fn = jax.jit(obj.sampling_log_weights_fn(model, variables))
    bounds = model_bounds(model, variables, x, noise, 10)  # log_weights_fn's, in one call
    for label in range(10):
        alone = obj.iwae_bound(log_weights_fn(x, jnp.full((6,), label, jnp.int32), noise))
        np.testing.assert_allclose(bounds[:, label], alone, rtol=1e-5, atol=1e-4)


def bayes_models():
    config = presets.test()
    ladder = config.replace(model="ladder", stochastic_layers=2, upper_latent_dim=3)
    return [(model, init_variables(model, jax.random.key(0)))
            for model in (create_model(config), create_model(ladder))]


@pytest.mark.parametrize("index", [0, 1], ids=["cvae", "ladder"])
def test_bayes_rule_reads_each_row_alone_and_normalises(index):
    """`create_bayes_classify_fn` (what /classify answers for a model trained with every
    label): the labels' probabilities, a row's reading independent of its neighbours, the
    per-label bounds of the model's own log weights."""
    model, variables = bayes_models()[index]
    x = jax.random.uniform(jax.random.key(1), (5, 784))
    classify = obj.create_bayes_classify_fn(model, num_samples=4)
    together = np.asarray(classify(variables, x))
    np.testing.assert_allclose(together.sum(axis=1), 1.0, rtol=1e-5)
    alone = np.asarray(classify(variables, x[2:3]))
    # (to float rounding across batch shapes: the sampler's fixed blocks make it exact)
    np.testing.assert_allclose(alone[0], together[2], rtol=1e-4, atol=1e-5)
    noise = jnp.broadcast_to(jax.random.normal(jax.random.key(0), (4, 1, model.noise_dim)),
                             (4, 5, model.noise_dim))
    bounds = model_bounds(model, variables, x, noise, model.num_classes)
    np.testing.assert_allclose(together, jax.nn.softmax(bounds, axis=-1), rtol=1e-4, atol=1e-6)


def test_a_trained_model_reads_digits_by_bayes_rule(transfer_run):
    from cvae.training.checkpoints import load_checkpoint

    checkpoint = load_checkpoint(transfer_run.directory)
    model, config = create_model(checkpoint.config), checkpoint.config
    images_u8, labels = transfer_run.data.test_images, transfer_run.data.test_labels
    x = iwae_eval.binarize_levels(jax.random.key(0), images_u8)
    noise = normals(12, (8, len(x), config.model.options.latent_dim))
    bounds = model_bounds(model, checkpoint.state.eval_variables(), x, noise, 10)
    read, _ = obj.bayes_classify(bounds)
    assert np.mean(np.asarray(read) == labels) >= 0.95
