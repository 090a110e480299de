"""cvae/model/transport.py: class moments of a mixture, and the Gaussian optimal-transport map."""

from __future__ import annotations

import numpy as np
import pytest

from cvae.config import presets
from cvae.model.transport import (ClassTransport, class_moments, class_transport,
                                  gaussian_transport)


def random_covariance(rng, size: int) -> np.ndarray:
    root = rng.standard_normal((size, size))
    return root @ root.T + 0.1 * np.eye(size)


def test_the_map_carries_one_gaussian_onto_the_other():
    rng = np.random.default_rng(0)
    cov_a, cov_b = random_covariance(rng, 4), random_covariance(rng, 4)
    a = gaussian_transport(cov_a, cov_b)
    np.testing.assert_allclose(a @ cov_a @ a.T, cov_b, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(a, a.T, atol=1e-8)  # the optimal map is symmetric positive
    assert np.all(np.linalg.eigvalsh((a + a.T) / 2) > 0)
    np.testing.assert_allclose(gaussian_transport(cov_a, cov_a), np.eye(4), atol=1e-8)


def test_class_moments_of_a_mixture():
    weights = np.array([[0.25, 0.75]])
    means = np.array([[[0.0, 0.0], [4.0, 0.0]]])
    tril = np.broadcast_to(np.eye(2), (1, 2, 2, 2))
    mean, covariance = class_moments({"weights": weights, "means": means, "scale_tril": tril})
    np.testing.assert_allclose(mean, [[3.0, 0.0]])
    # Var along x: 1 + 0.25 * 9 + 0.75 * 1 = 4; along y: 1.
    np.testing.assert_allclose(covariance, [[[4.0, 0.0], [0.0, 1.0]]])


def test_apply_moves_codes_between_classes_and_keeps_a_class_own_bit_for_bit():
    rng = np.random.default_rng(1)
    means = rng.standard_normal((2, 3))
    maps = np.stack([np.stack([np.eye(3), 2 * np.eye(3)]), np.stack([0.5 * np.eye(3),
                                                                      np.eye(3)])])
    transport = ClassTransport(means, maps)
    z = rng.standard_normal((4, 3)).astype(np.float32)
    out = transport.apply(z, np.array([0, 0, 1, 1]), np.array([0, 1, 1, 0]))
    assert out.dtype == np.float32
    assert np.array_equal(out[[0, 2]], z[[0, 2]])
    np.testing.assert_allclose(out[1], means[1] + 2 * (z[1] - means[0]), rtol=1e-6)
    np.testing.assert_allclose(out[3], means[0] + 0.5 * (z[3] - means[1]), rtol=1e-6)
    # The class mean goes to the class mean.
    moved = transport.apply(means[:1].astype(np.float32), np.array([0]), np.array([1]))
    np.testing.assert_allclose(moved[0], means[1], rtol=1e-6)


def test_the_standard_prior_has_no_transport():
    assert class_transport(presets.test(), {}) is None


@pytest.mark.parametrize("components", [1, 3])
def test_a_mixture_prior_gets_maps_between_all_classes(components):
    rng = np.random.default_rng(2)
    tril = np.linalg.cholesky(np.stack([[random_covariance(rng, 3) for _ in range(components)]
                                        for _ in range(10)]))
    mixture = {"weights": np.full((10, components), 1 / components),
               "means": rng.standard_normal((10, components, 3)), "scale_tril": tril}
    config = presets.test().replace(prior="mixture", prior_components=components,
                                       latent_dim=3)
    transport = class_transport(config, {"prior": {"mixture": mixture}})
    assert transport.maps.shape == (10, 10, 3, 3)
    _, covariances = class_moments(mixture)
    for a, b in ((0, 1), (7, 3)):
        carried = transport.maps[a, b] @ covariances[a] @ transport.maps[a, b].T
        np.testing.assert_allclose(carried, covariances[b], rtol=1e-6, atol=1e-8)
