import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae.model.losses import kl_divergence, objective, reconstruction, vae_loss


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
    z = mean + jnp.exp(0.5 * logvar) * jax.random.normal(jax.random.key(0), (200000, 1))
    log_q = jax.scipy.stats.norm.logpdf(z, mean, jnp.exp(0.5 * logvar))
    log_p = jax.scipy.stats.norm.logpdf(z)
    assert float(jnp.mean(log_q - log_p)) == pytest.approx(
        float(kl_divergence(mean, logvar)[0]), abs=0.01)


def test_bernoulli_reconstruction_is_binary_cross_entropy_summed_over_pixels():
    logits = jnp.array([[0.0, 2.0]])
    targets = jnp.array([[1.0, 0.0]])
    expected = np.log(2.0) + np.log1p(np.exp(2.0))
    assert float(reconstruction(logits, targets, "bernoulli")[0]) == pytest.approx(expected, 1e-6)


def test_gaussian_reconstruction_is_summed_half_squared_error_of_sigmoid_means():
    logits = jnp.array([[0.0, 0.0]])
    targets = jnp.array([[1.0, 0.0]])
    assert float(reconstruction(logits, targets, "gaussian")[0]) == pytest.approx(
        0.5 * 0.25 + 0.5 * 0.25)


def test_unknown_likelihood_is_rejected_by_name():
    with pytest.raises(ValueError, match="likelihood"):
        reconstruction(jnp.zeros((1, 2)), jnp.zeros((1, 2)), "poisson")


def test_loss_is_batch_mean_reconstruction_plus_weighted_kl_by_hand():
    # Logits 0 are p = 0.5 on every pixel: each of the 784 targets of 1 costs log 2 nats.
    logits, targets = jnp.zeros((2, 784)), jnp.ones((2, 784))
    # Example 1: mean 1 in 3 dimensions, unit variance: KL 3 * 0.5 = 1.5; example 2: KL 0.
    mean = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    logvar = jnp.zeros((2, 3))
    loss, terms = vae_loss(logits, targets, mean=mean, logvar=logvar, likelihood="bernoulli",
                           kl_weight=0.5)
    assert float(terms["reconstruction"]) == pytest.approx(784 * np.log(2), rel=1e-6)
    assert float(terms["kl"]) == pytest.approx(0.75, rel=1e-6)
    assert float(loss) == pytest.approx(784 * np.log(2) + 0.5 * 0.75, rel=1e-6)
    assert float(terms["loss"]) == float(loss)


def test_free_bits_floor_each_dimensions_batch_mean_kl():
    # Per-example, per-dimension KLs 0.5 * mean^2: [0.005, 4.5] and [0.005, 0.5]; batch means
    # 0.005 and 2.5. Floored at 1 nat: 1.0 + 2.5 = 3.5 (unfloored: 2.505).
    logits, targets = jnp.zeros((2, 784)), jnp.ones((2, 784))
    mean, logvar = jnp.array([[0.1, 3.0], [0.1, 1.0]]), jnp.zeros((2, 2))
    loss, terms = vae_loss(logits, targets, mean=mean, logvar=logvar, likelihood="bernoulli",
                           kl_weight=2.0,
                           free_bits=1.0)
    assert float(loss) == pytest.approx(784 * np.log(2) + 2.0 * 3.5, rel=1e-6)
    assert float(terms["kl"]) == pytest.approx(2.505, rel=1e-6)  # reported unfloored
    loss_without, _ = vae_loss(logits, targets, mean=mean, logvar=logvar, likelihood="bernoulli",
                               kl_weight=2.0)
    assert float(loss_without) == pytest.approx(784 * np.log(2) + 2.0 * 2.505, rel=1e-6)


def test_objective_from_mean_terms():
    per_dim = jnp.array([0.005, 2.5])
    assert float(objective(10.0, 2.505, per_dim, kl_weight=2.0)) == pytest.approx(15.01)
    assert float(objective(10.0, 2.505, per_dim, kl_weight=2.0, free_bits=1.0)) == \
        pytest.approx(17.0)
