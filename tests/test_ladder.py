"""The ladder VAE end to end on tiny real runs: the sampler draws noise of every layer and
decodes the top layer's codes, the same bits alone and batched; transfers, walks, Bayes' rule
and the service work on it; `cvae eval` scores it. (Its export: tests/test_export.py's "ladder"
kind, whose run, trained with per-layer free bits and a KL warm-up, these tests read. `cvae
train` trains it with DReG under a learned prior and resumes exactly, SIGKILLed:
tests/test_reliability.py's lever test.)"""

from __future__ import annotations

import io
import json

import jax
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from cvae.cli.main import main
from cvae.data.synthetic import synthetic_images
from cvae.model import prior as prior_lib
from cvae.model.densities import pixel_means
from cvae.model.registry import create_model
from cvae.model.store import load_trained_model
from cvae.sampling.request_batches import request_rows
from cvae.sampling.sampler import load_sampler
from cvae.sampling.latents import Codes, LatentRequest, batch_latents
from cvae.sampling.transfer import TransferRequest, transfer_latents
from cvae.sampling.walks import DigitWalk, LatentWalk, walk_latents



@pytest.fixture(scope="module")
def ladder(export_runs):
    """The export tests' ladder run (2 layers of 4 + 3, the mixture fitted to its top codes),
    and a sampler of its newest step."""
    run = export_runs("ladder")
    return run, load_sampler(run.directory)


def test_the_fitted_mixture_is_fitted_to_the_top_layers_codes(ladder):
    run, sampler = ladder
    trained = load_trained_model(run.directory)
    assert trained.variables["prior"]["mixture"]["means"].shape == (10, 2, 3)
    assert (sampler.noise_dim, sampler.code_dim) == (7, 3)


@pytest.mark.determinism
def test_samples_draw_every_layer_and_keep_their_bits_alone_and_batched(ladder):
    _, sampler = ladder
    requests = [LatentRequest(1, (7,), 5, 1.0), LatentRequest(2, sampler.classes, 3, 0.5),
                LatentRequest(1, (7,), 20, 1.0)]
    alone = [sampler.decode(*batch_latents([r], sampler.noise_dim)[0]) for r in requests]
    drawn = request_rows(requests, sampler)
    together = sampler.decode(np.concatenate([z for z, _ in drawn]),
                              np.concatenate([labels for _, labels in drawn]))
    assert np.array_equal(np.concatenate(alone).view(np.uint32), together.view(np.uint32))
    assert np.array_equal(sampler.sample_images(7, 5, 1).view(np.uint32), alone[0].view(np.uint32))
    # The layers below the top are drawn too: their share of the noise changes the pictures.
    z, labels = batch_latents(requests[:1], sampler.noise_dim)[0]
    lower = z.copy()
    lower[:, sampler.code_dim:] += 1.0
    assert not np.allclose(sampler.decode(lower, labels), alone[0], atol=1e-3)


def test_transfers_and_walks_decode_the_top_layers_codes(ladder):
    _, sampler = ladder
    image = synthetic_images(np.array([3]))[0]
    requests = [TransferRequest(image, None, (1, 7), 0, 0), TransferRequest(image, 3, (5,), 2, 9)]
    transfers = transfer_latents(requests, sampler)
    assert [codes.z.shape for codes in transfers] == [(2, 3), (2, 3)]
    walks = walk_latents([LatentWalk(1, 2, (7, 4), 4, 1.0),
                          DigitWalk(3, 4, 2, 1.0, sampler.classes)], sampler)
    assert [codes.z.shape for codes in walks] == [(8, 3), (20, 3)]
    # A walk's ends are /sample's draws mapped to codes: the top layer's noise through the prior.
    noise, labels = batch_latents([LatentRequest(1, (7,), 1, 1.0)], sampler.noise_dim)[0]
    mixture = sampler.variables[prior_lib.COLLECTION][prior_lib.VARIABLE]
    np.testing.assert_allclose(walks[0].z[0], prior_lib.sample(mixture, noise[:, :3], labels)[0],
                               rtol=1e-5, atol=1e-6)
    # decode_codes decodes a code with the layers below at their top-down means.
    codes = transfers[0]
    model = create_model(sampler.config)
    expected = pixel_means(model.apply(sampler.variables, codes.z, codes.labels,
                                       method="decode"),
                           sampler.config.drawing.pixel_sharpness).reshape(-1, 28, 28)
    np.testing.assert_allclose(sampler.decode_codes(codes.z, codes.labels), expected, atol=1e-6)
    # Codes keep their bits whatever they are decoded with.
    every = [*transfers, *walks]
    together = sampler.decode_codes(np.concatenate([c.z for c in every]),
                                    np.concatenate([c.labels for c in every]))
    alone = np.concatenate([sampler.decode_codes(c.z, c.labels) for c in every])
    assert np.array_equal(together.view(np.uint32), alone.view(np.uint32))
    assert isinstance(transfers[0], Codes) and transfers[1].label == 3


def test_bayes_rule_reads_digits_and_the_service_serves_the_ladder(ladder):
    from service.app import create_app

    run, sampler = ladder
    digits = (synthetic_images(np.arange(10)) > 127).astype(np.uint8) * 255
    probabilities = sampler.classify(digits)
    assert probabilities.shape == (10, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    buffer = io.BytesIO()
    Image.fromarray(digits[4]).save(buffer, format="PNG")
    with TestClient(create_app(run.directory)) as client:
        for path in ("/sample?digit=7&n=4&seed=1", "/interpolate?digit=2&steps=4&seed=3",
                     "/interpolate?walk=digits&n=2&seed=3"):
            reply = client.get(path)
            assert reply.status_code == 200 and reply.headers["content-type"] == "image/png", path
        assert client.get("/sample?digit=7&n=4&seed=1").content == sampler.sample_png(7, 4, 1)
        reply = client.post("/transfer?samples=2&seed=4", content=buffer.getvalue(),
                            headers={"content-type": "image/png"})
        assert reply.status_code == 200, reply.text
        reply = client.post("/classify", content=buffer.getvalue(),
                            headers={"content-type": "image/png"})
        assert reply.status_code == 200 and len(reply.json()["probabilities"]) == 10


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_cvae_eval_scores_a_ladder(ladder, eval_data_dir, tmp_path, capsys):
    run, _ = ladder
    out = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint-dir", str(run.directory), "--data-dir", str(eval_data_dir),
                 "--json", str(out), "--iwae-k", "4", "--iwae-k-marginal", "2", "--iwae-chunk",
                 "4", "--iwae-limit", "20", "--samples-per-digit", "6"]) == 0
    table = capsys.readouterr().out
    assert "-log p(x|y), IWAE K=4" in table and "argmax_y p(x|y) error, K=2" in table
    results = json.loads(out.read_text())
    bound = results["iwae"]
    assert bound["marginal_check"]["ok"] and np.isfinite(bound["nll_conditional"])
    assert 0 <= bound["bayes_rule"]["error"] <= 1
    assert 0 <= results["elbo"]["active_units"] <= results["latent_dim"] == 7  # every layer
    assert len(results["fidelity"]["samples"]["accuracy_per_digit"]) == 10
    assert results["fidelity"]["reconstructions"]["digits"] == 32
    assert results["label_swap"]["swaps"] == 9 * 64
    assert jax.tree.leaves(results["reports"])
