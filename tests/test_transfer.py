"""cvae/sampling/transfer.py and the sampler's encoder: posterior latents of uploaded digits (that a
request's values do not depend on its batch is tests/test_bit_identity.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from cvae.sampling.sampler import load_sampler
from cvae.sampling.latents import request_latents
from cvae.sampling.transfer import TransferRequest, transfer_latents, transfer_tiles


@pytest.fixture(scope="module")
def sampler(trained_run):
    return load_sampler(trained_run.directory)


@pytest.fixture(scope="module")
def trained_sampler(transfer_run):
    return load_sampler(transfer_run.directory)


def test_codes_are_decoded_by_the_model_as_they_are(sampler, trained_run):
    """A transfer's rows are posterior latents: decoded by the model's `decode` itself,
    whatever the sampler does to prior draws."""
    from cvae.model.densities import pixel_means
    from cvae.model.registry import create_model

    image, label = trained_run.data.test_images[2], int(trained_run.data.test_labels[2])
    [codes] = transfer_latents([TransferRequest(image, label, sampler.classes, 0, 0)], sampler)
    model = create_model(sampler.config)
    direct = pixel_means(model.apply(sampler.variables, codes.z, codes.labels,
                                     method="decode"),
                         sampler.config.drawing.pixel_sharpness).reshape(-1, 28, 28)
    np.testing.assert_allclose(sampler.decode_codes(codes.z, codes.labels), direct, atol=1e-6)


def test_posterior_mean_rows_are_the_mean_decoded_with_each_digit(sampler, trained_run):
    image, label = trained_run.data.test_images[3], int(trained_run.data.test_labels[3])
    [(z, labels, used)] = transfer_latents(
        [TransferRequest(image, label, (4, 0, 4), 0, 0)], sampler)
    mean, _, _ = sampler.encode(image[None], np.array([label]))
    assert used == label
    assert np.array_equal(z, np.repeat(mean, 3, axis=0)) and labels.tolist() == [4, 0, 4]


def test_without_a_label_the_lowest_negative_elbo_wins(sampler, trained_run):
    image = trained_run.data.test_images[5]
    _, _, neg_elbo = sampler.encode(np.repeat(image[None], 10, axis=0), np.arange(10))
    [(_, _, used)] = transfer_latents([TransferRequest(image, None, sampler.classes, 0, 0)],
                                      sampler)
    assert used == int(np.argmin(neg_elbo))


def test_the_model_reads_the_labels_of_digits_it_learned(trained_sampler, transfer_run):
    images, labels = transfer_run.data.test_images, transfer_run.data.test_labels
    read = transfer_latents([TransferRequest(x, None, (0,), 0, 0) for x in images],
                            trained_sampler)
    assert np.mean([used for _, _, used in read] == labels) >= 0.95


def test_posterior_draws_are_seeded_row_major_by_draw(sampler, trained_run):
    image = trained_run.data.test_images[0]
    request = TransferRequest(image, 2, (1, 7), 3, 11)
    [(z, labels, _)] = transfer_latents([request], sampler)
    [(again, _, _)] = transfer_latents([request], sampler)
    [(other, _, _)] = transfer_latents([request._replace(seed=12)], sampler)
    assert z.shape == (6, sampler.code_dim) and labels.tolist() == [1, 7, 1, 7, 1, 7]
    assert np.array_equal(z, again) and not np.array_equal(z, other)
    assert np.array_equal(z[0], z[1]) and not np.array_equal(z[0], z[2])  # one z per row
    mean, logvar, _ = sampler.encode(image[None], np.array([2]))
    eps, _ = request_latents(11, (2,), 3, noise_width=sampler.code_dim, temperature=1.0)
    assert np.array_equal(z[::2], mean + np.exp(np.float32(0.5) * logvar) * eps)


def test_tiles_lead_each_row_with_the_input_when_asked():
    image = np.full((28, 28), 255, np.uint8)
    request = TransferRequest(image, 1, (2, 3), 2, 0)
    decoded = np.stack([np.full((28, 28), v, np.float32) for v in (0.1, 0.2, 0.3, 0.4)])
    assert transfer_tiles(decoded, request, show_input=False) is decoded
    tiles = transfer_tiles(decoded, request, show_input=True)
    assert np.array_equal(tiles[:, 0, 0], np.float32([1.0, 0.1, 0.2, 1.0, 0.3, 0.4]))
