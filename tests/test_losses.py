"""The densities (cvae/model/densities.py) and the loss `objectives.batch_loss` makes of a
batch's rows, by hand on tiny arrays: the KL and the reconstruction in closed form, free bits
on the closed-form dimensions and on the sampled rest, M2's weighted rows, and the ELBO of a
tiny one-latent model written out from its encoder and decoder."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.config import presets
from cvae.model import densities, objectives
from cvae.model.objectives import RowTerms
from cvae.model.interface import Terms, sampled_terms
from cvae.model.registry import create_model, init_variables
from jitted import apply


def kl_divergence(mean, logvar):
    return densities.kl_per_dimension(mean, logvar).sum(axis=-1)


def test_kl_matches_closed_form_for_one_gaussian():
    mean = jnp.array([[0.5, -1.0]])
    logvar = jnp.log(jnp.array([[0.25, 4.0]]))
    var = np.array([0.25, 4.0])
    expected = 0.5 * np.sum(var + np.array([0.5, -1.0]) ** 2 - 1 - np.log(var))
    assert float(kl_divergence(mean, logvar)[0]) == pytest.approx(expected, rel=1e-6)


def test_kl_of_standard_normal_is_zero():
    assert float(kl_divergence(jnp.zeros((1, 8)), jnp.zeros((1, 8)))[0]) == 0.0


def test_kl_matches_a_monte_carlo_estimate():
    mean, logvar = jnp.array([[1.0]]), jnp.array([[-0.5]])

    @jax.jit  # eager, each op compiled on its own
    def estimate(mean, logvar):
        z = mean + jnp.exp(0.5 * logvar) * jax.random.normal(jax.random.key(0), (200000, 1))
        log_q = jax.scipy.stats.norm.logpdf(z, mean, jnp.exp(0.5 * logvar))
        log_p = jax.scipy.stats.norm.logpdf(z)
        return jnp.mean(log_q - log_p)

    assert float(estimate(mean, logvar)) == pytest.approx(
        float(kl_divergence(mean, logvar)[0]), abs=0.01)


def test_gaussian_kl_against_the_standard_normal_is_kl_per_dimension():
    mean, logvar = jnp.array([[0.5, -1.0, 2.0]]), jnp.array([[0.3, -0.7, 1.1]])
    np.testing.assert_allclose(densities.gaussian_kl((mean, logvar), (0.0, 0.0)),
                               densities.kl_per_dimension(mean, logvar), rtol=1e-6)
    np.testing.assert_allclose(densities.gaussian_kl((mean, logvar), (mean, logvar)), 0.0,
                               atol=1e-7)


def test_densities_are_normal_log_densities():
    z = jnp.array([[0.3, -1.2], [2.0, 0.5]])
    mean, logvar = jnp.array([0.1, -0.4]), jnp.array([0.2, -0.6])
    scipy_like = jax.scipy.stats.norm.logpdf(z, mean, jnp.exp(0.5 * logvar)).sum(-1)
    np.testing.assert_allclose(densities.gaussian_log_density(z, mean, logvar), scipy_like,
                               rtol=1e-6)
    np.testing.assert_allclose(densities.standard_log_density(z),
                               jax.scipy.stats.norm.logpdf(z).sum(-1), rtol=1e-6)


def test_bernoulli_reconstruction_is_binary_cross_entropy_summed_over_pixels():
    logits = jnp.array([[0.0, 2.0]])
    targets = jnp.array([[1.0, 0.0]])
    expected = np.log(2.0) + np.log1p(np.exp(2.0))
    assert float(densities.reconstruction(logits, targets, "bernoulli")[0]) == pytest.approx(
        expected, 1e-6)


def test_gaussian_reconstruction_is_summed_half_squared_error_of_sigmoid_means():
    logits = jnp.array([[0.0, 0.0]])
    targets = jnp.array([[1.0, 0.0]])
    assert float(densities.reconstruction(logits, targets, "gaussian")[0]) == pytest.approx(
        0.5 * 0.25 + 0.5 * 0.25)


def test_unknown_likelihood_is_rejected_by_name():
    with pytest.raises(ValueError, match="likelihood"):
        densities.reconstruction(jnp.zeros((1, 2)), jnp.zeros((1, 2)), "poisson")


# ---- the loss of a batch's rows ----------------------------------------------------------------


class Fixed:
    """A stand-in family whose `terms` are given: what `objectives.row_terms` reads of a model
    (`apply` with a method, `noise_dim`), so the loss is checked on numbers chosen by hand."""

    def __init__(self, terms: Terms, noise_dim: int):
        self.fixed, self.noise_dim = terms, noise_dim

    def terms(self, *args, **kwargs) -> Terms:
        return self.fixed

    def apply(self, variables, *args, method, rngs=None, mutable=False, **kwargs):
        out = method(self, *args, **kwargs) if callable(method) else getattr(self, method)(
            *args, **kwargs)
        return out if mutable is False else (out, {})


@functools.partial(jax.jit, static_argnames=("noise_dim", "objective", "kl_weight"))
def fixed_rows(terms: Terms, noise_dim: int, objective: str, kl_weight: float) -> RowTerms:
    """The rows of `Fixed(terms)`, jitted (eager, each op compiled on its own)."""
    model = Fixed(terms, noise_dim)
    k, b = terms.log_px.shape
    rows, _, _ = objectives.row_terms(model, {}, images=jnp.zeros((b, 1)),
                                      labels=jnp.zeros((b,), jnp.int32),
                                      noise=jnp.zeros((k, b, noise_dim)), objective=objective,
                                      kl_weight=kl_weight)
    return rows


def rows_of(terms: Terms, noise_dim: int, *, objective="elbo", kl_weight=1.0) -> RowTerms:
    rows = fixed_rows(terms, noise_dim, objective, kl_weight)
    return rows._replace(rest_dims=int(rows.rest_dims))  # a Python int, as row_terms gives it


@functools.partial(jax.jit, static_argnames=("rest_dims", "objective", "kl_weight", "free_bits"))
def jitted_batch_loss(rows, weights, rest_dims, objective, kl_weight, free_bits):
    return objectives.batch_loss(rows._replace(rest_dims=rest_dims), objective=objective,
                                 kl_weight=kl_weight, free_bits=free_bits, weights=weights)


def batch_loss(rows: RowTerms, *, objective, kl_weight, free_bits, weights=None):
    """`objectives.batch_loss`, jitted (eager, each op compiled on its own), rest_dims static as
    in the train step."""
    return jitted_batch_loss(rows._replace(rest_dims=None), weights, int(rows.rest_dims),
                             objective, kl_weight, free_bits)


@functools.partial(jax.jit, static_argnames=("model", "objective", "kl_weight"))
def model_rows(model, variables, images, labels, noise, objective, kl_weight) -> RowTerms:
    """A real model's rows, jitted (eager, each op compiled on its own); rest_dims an array."""
    rows, _, _ = objectives.row_terms(model, variables, images=images, labels=labels,
                                      noise=noise, objective=objective, kl_weight=kl_weight)
    return rows


def closed_form_terms(log_px, kl_dims) -> Terms:
    """One draw's terms with every dimension's KL in closed form (the one-latent family's)."""
    log_px, kl_dims = jnp.asarray([log_px], jnp.float32), jnp.asarray([kl_dims], jnp.float32)
    zeros = jnp.zeros_like(log_px)
    return Terms(log_px, zeros, kl_dims.sum(-1), kl_dims, zeros)


def test_loss_is_batch_mean_reconstruction_plus_weighted_kl_by_hand():
    # Logits 0 are p = 0.5 on every pixel: each of the 784 targets of 1 costs log 2 nats.
    logits, targets = jnp.zeros((2, 784)), jnp.ones((2, 784))
    # Example 1: mean 1 in 3 dimensions, unit variance: KL 3 * 0.5 = 1.5; example 2: KL 0.
    mean = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    logvar = jnp.zeros((2, 3))
    terms = closed_form_terms(-densities.reconstruction(logits, targets, "bernoulli"),
                              densities.kl_per_dimension(mean, logvar))
    rows = rows_of(terms, 3, kl_weight=0.5)
    loss, parts = batch_loss(rows, objective="elbo", kl_weight=0.5, free_bits=0.0)
    assert float(parts["reconstruction"]) == pytest.approx(784 * np.log(2), rel=1e-6)
    assert float(parts["kl"]) == pytest.approx(0.75, rel=1e-6)
    assert float(loss) == pytest.approx(784 * np.log(2) + 0.5 * 0.75, rel=1e-6)
    assert float(parts["loss"]) == float(loss)
    assert "bound" not in parts


def test_free_bits_floor_each_dimensions_batch_mean_kl():
    # Per-example, per-dimension KLs 0.5 * mean^2: [0.005, 4.5] and [0.005, 0.5]; batch means
    # 0.005 and 2.5. Floored at 1 nat: 1.0 + 2.5 = 3.5 (unfloored: 2.505).
    logits, targets = jnp.zeros((2, 784)), jnp.ones((2, 784))
    mean, logvar = jnp.array([[0.1, 3.0], [0.1, 1.0]]), jnp.zeros((2, 2))
    terms = closed_form_terms(-densities.reconstruction(logits, targets, "bernoulli"),
                              densities.kl_per_dimension(mean, logvar))
    rows = rows_of(terms, 2, kl_weight=2.0)
    assert rows.rest_dims == 0
    loss, parts = batch_loss(rows, objective="elbo", kl_weight=2.0, free_bits=1.0)
    assert float(loss) == pytest.approx(784 * np.log(2) + 2.0 * 3.5, rel=1e-6)
    assert float(parts["kl"]) == pytest.approx(2.505, rel=1e-6)  # reported unfloored
    without, _ = batch_loss(rows, objective="elbo", kl_weight=2.0, free_bits=0.0)
    assert float(without) == pytest.approx(784 * np.log(2) + 2.0 * 2.505, rel=1e-6)


def test_counted_kl_from_mean_terms():
    per_dim = jnp.array([0.005, 2.5])

    def counted(kl, rest, rest_dims, free_bits):
        return float(objectives.counted_kl(kl, per_dim, rest, rest_dims=rest_dims,
                                           free_bits=free_bits))

    assert counted(2.505, 0.0, 0, 0.0) == pytest.approx(2.505)
    assert counted(2.505, 0.0, 0, 1.0) == pytest.approx(3.5)
    # The sampled rest (3 dimensions, mean 0.4 nats): floored at 1 nat a dimension it covers.
    assert counted(2.905, 0.4, 3, 1.0) == pytest.approx(6.5)
    assert counted(2.905, 4.0, 3, 1.0) == pytest.approx(7.5)


def test_free_bits_floor_the_sampled_kl_at_free_bits_a_dimension_it_covers():
    """A learned prior's KL has no closed form: its one-draw estimate log q - log p is floored
    as a whole, at free_bits times the dimensions it covers (noise_dim minus the closed-form
    ones)."""
    log_px = jnp.array([[-100.0, -120.0, -80.0]])
    log_qz = jnp.array([[-1.0, -2.0, -0.5]])
    log_pz = jnp.array([[-1.5, -1.0, -2.0]])  # kl_rest = [0.5, -1.0, 1.5]: mean 1/3
    rows = rows_of(sampled_terms(log_px, log_pz, log_qz), 4)
    assert rows.rest_dims == 4 and rows.kl_dims.shape == (3, 0)
    np.testing.assert_allclose(rows.kl_rest, [0.5, -1.0, 1.5])
    loss, parts = batch_loss(rows, objective="elbo", kl_weight=0.5, free_bits=0.25)
    assert float(parts["kl"]) == pytest.approx(1 / 3, rel=1e-6)
    assert float(loss) == pytest.approx(100.0 + 0.5 * 0.25 * 4, rel=1e-6)  # the floor: 1 nat
    loss, _ = batch_loss(rows, objective="elbo", kl_weight=0.5, free_bits=0.05)
    assert float(loss) == pytest.approx(100.0 + 0.5 / 3, rel=1e-6)  # above the floor (0.2)


def test_free_bits_act_on_both_parts_of_a_ladder_with_a_learned_top():
    """Two closed-form dimensions (the lower layer's) and a sampled rest of three (the top
    layer's, under a learned prior): each closed-form dimension's mean floored at free_bits,
    the rest's mean at 3 free_bits."""
    kl_dims = jnp.array([[[0.1, 2.0], [0.3, 1.0]]])  # means 0.2 and 1.5
    kl_rest = jnp.array([[0.4, 0.2]])  # mean 0.3
    log_px = jnp.array([[-10.0, -20.0]])
    terms = Terms(log_px, jnp.zeros_like(log_px), kl_dims.sum(-1) + kl_rest, kl_dims, kl_rest)
    rows = rows_of(terms, 5)
    assert rows.rest_dims == 3
    loss, parts = batch_loss(rows, objective="elbo", kl_weight=1.0, free_bits=0.5)
    assert float(parts["kl"]) == pytest.approx(0.2 + 1.5 + 0.3, rel=1e-6)
    assert float(loss) == pytest.approx(15.0 + (0.5 + 1.5) + 3 * 0.5, rel=1e-6)


def test_weighted_rows_are_m2s_explicit_formula():
    """With M2's weights w (few_labels.semi_supervised_loss), the loss is
    sum_b w_b (rec_b + beta KL_b) plus beta times what the floor adds to each dimension's
    weighted KL, written out here in float64."""
    rng = np.random.default_rng(0)
    b, d, beta, floor = 7, 3, 0.7, 0.3
    rec = rng.random(b) * 100
    kl_dims = rng.random((b, d)) * 0.6
    weights = rng.random(b)
    weights /= weights.sum() * 1.3  # M2's weights need not sum to one
    log_px = jnp.asarray(-rec[None], jnp.float32)
    terms = Terms(log_px, jnp.zeros_like(log_px), jnp.asarray(kl_dims.sum(-1)[None], jnp.float32),
                  jnp.asarray(kl_dims[None], jnp.float32), jnp.zeros_like(log_px))
    rows = rows_of(terms, d, kl_weight=beta)
    w = jnp.asarray(weights, jnp.float32)
    for free_bits in (0.0, floor):
        loss, parts = batch_loss(rows, objective="elbo", kl_weight=beta, free_bits=free_bits,
                                 weights=w)
        per_dim = weights @ kl_dims
        counted = np.maximum(per_dim, free_bits).sum() if free_bits else per_dim.sum()
        expected = weights @ (rec + beta * kl_dims.sum(-1)) + beta * (counted - per_dim.sum())
        assert float(loss) == pytest.approx(expected, rel=1e-5)
        assert float(parts["reconstruction"]) == pytest.approx(weights @ rec, rel=1e-5)
        assert float(parts["kl"]) == pytest.approx(per_dim.sum(), rel=1e-5)
    assert np.any(per_dim < floor)  # the floor acted
    # An importance-weighted objective's rows: the weighted negative bounds, nothing floored.
    noise_rows = rows_of(Terms(jnp.concatenate([log_px, log_px - 1.0]),
                               jnp.zeros((2, b)), jnp.zeros((2, b)), jnp.zeros((2, b, 0)),
                               jnp.zeros((2, b))), d, objective="iwae", kl_weight=beta)
    loss, parts = batch_loss(noise_rows, objective="iwae", kl_weight=beta, free_bits=0.0,
                             weights=w)
    bound = np.logaddexp(-rec, -rec - 1.0) - np.log(2)
    assert float(loss) == pytest.approx(-(weights @ bound), rel=1e-5)
    assert float(parts["bound"]) == pytest.approx(weights @ bound, rel=1e-5)


@pytest.mark.parametrize("kl_weight", [1.0, 0.7])
def test_the_elbo_of_a_tiny_one_latent_model_by_hand(kl_weight):
    """-ELBO = -(log p(x|z,y) - KL(q(z|x,y) || N(0, I))) with z = mean + sigma * noise, from the
    encoder's and the decoder's outputs, in float64."""
    config = presets.test().replace(hidden_sizes=(8,), latent_dim=2, prior="standard")
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    x = jax.random.bernoulli(jax.random.key(1), 0.3, (3, 784)).astype(jnp.float32)
    y = jnp.array([0, 4, 9], jnp.int32)
    noise = jax.random.normal(jax.random.key(2), (1, 3, 2))
    mean, logvar = (np.asarray(a, np.float64)
                    for a in apply(model, variables, x, y, method="encode"))
    z = mean + np.exp(0.5 * logvar) * np.asarray(noise[0], np.float64)
    logits = np.asarray(apply(model, variables, jnp.asarray(z, jnp.float32), y, method="decode"),
                        np.float64)
    targets = np.asarray(x, np.float64)
    log_px = np.sum(targets * -np.logaddexp(0, -logits)
                    + (1 - targets) * -np.logaddexp(0, logits), axis=-1)
    kl = 0.5 * np.sum(np.exp(logvar) + mean ** 2 - 1 - logvar, axis=-1)

    rows = model_rows(model, variables, x, y, noise, "elbo", kl_weight)
    np.testing.assert_allclose(rows.bound, log_px - kl, rtol=1e-5)
    np.testing.assert_allclose(rows.reconstruction, -log_px, rtol=1e-5)
    np.testing.assert_allclose(rows.kl, kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(rows.neg_bound, -log_px + kl_weight * kl, rtol=1e-5)
    loss, parts = batch_loss(rows, objective="elbo", kl_weight=kl_weight, free_bits=0.0)
    assert float(loss) == pytest.approx(np.mean(-log_px + kl_weight * kl), rel=1e-5)
    assert float(parts["kl"]) == pytest.approx(kl.mean(), rel=1e-4)
    # The importance-weighted bound of one draw is this ELBO with the KL sampled.
    iwae = model_rows(model, variables, x, y, noise, "iwae", 1.0)
    log_q = np.sum(-0.5 * (np.log(2 * np.pi) + logvar + (z - mean) ** 2 / np.exp(logvar)), -1)
    log_p = np.sum(-0.5 * (np.log(2 * np.pi) + z ** 2), -1)
    np.testing.assert_allclose(iwae.bound, log_px + log_p - log_q, rtol=1e-5)
