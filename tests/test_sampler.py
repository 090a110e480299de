from io import BytesIO

import jax
import numpy as np
import pytest
from PIL import Image

from cvae.config import presets
from cvae.sampling.grid import grid_shape
from cvae.model.densities import pixel_means
from cvae.model.registry import create_model, init_variables
from cvae.sampling.blocks import DECODE_BLOCKS, ROW_BY_ROW
from cvae.sampling.grid import grid_columns
from cvae.sampling.sampler import create_sampler
from cvae.sampling.latents import draw_latents, request_latents


@pytest.fixture(scope="module")
def sampler():
    config = presets.test()
    model = create_model(config)
    sampler = create_sampler(model, config, init_variables(model, jax.random.key(0)),
                             block_rows=8)
    sampler.check_blocks()  # 8 rows, or one row per call where 8 do not keep a row's bits
    return sampler


def test_latents_depend_only_on_seed_digit_and_temperature():
    a = draw_latents(1, 7, 5, noise_width=4, temperature=1.0)
    np.testing.assert_array_equal(a, draw_latents(1, 7, 5, noise_width=4, temperature=1.0))
    assert not np.array_equal(a, draw_latents(2, 7, 5, noise_width=4, temperature=1.0))
    assert not np.array_equal(a, draw_latents(1, 6, 5, noise_width=4, temperature=1.0))
    np.testing.assert_allclose(draw_latents(1, 7, 5, noise_width=4, temperature=0.5), 0.5 * a,
                               rtol=1e-6)


def test_all_digits_request_is_digit_major():
    z, labels = request_latents(0, tuple(range(10)), 3, noise_width=4, temperature=1.0)
    assert z.shape == (30, 4)
    assert labels.tolist() == [d for d in range(10) for _ in range(3)]


def test_decode_in_blocks_equals_decode_alone(sampler):
    z, labels = request_latents(5, (3,), 3, noise_width=4, temperature=1.0)
    alone = sampler.decode(z, labels)
    other_z, other_labels = request_latents(9, (1,), 13, noise_width=4, temperature=1.0)
    together = sampler.decode(np.concatenate([other_z, z]), np.concatenate([other_labels, labels]))
    np.testing.assert_array_equal(alone, together[13:])
    assert alone.shape == (3, 28, 28) and alone.min() >= 0 and alone.max() <= 1


def test_images_render_the_logits_at_the_configs_sharpness():
    """sigmoid(s * logits), s from the config; at s = 1 the decoder's plain means, bit for bit;
    sharper: fewer grey pixels, the same bright and dark ones."""
    model = create_model(presets.test())
    variables = init_variables(model, jax.random.key(0))
    z, labels = request_latents(2, tuple(range(10)), 4, noise_width=4, temperature=1.0)
    logits = model.apply(variables, z, labels, method="generate")
    images = {s: create_sampler(model, presets.test().replace(pixel_sharpness=s), variables,
                                block_rows=8).decode(z, labels) for s in (1.0, 2.0)}
    np.testing.assert_array_equal(jax.jit(lambda x: pixel_means(x, 1.0))(logits),
                                  jax.jit(jax.nn.sigmoid)(logits))
    for s, image in images.items():
        np.testing.assert_allclose(image.reshape(40, -1), jax.nn.sigmoid(s * logits),
                                   rtol=1e-5, atol=1e-6)
    assert ((images[1.0] > 0.5) == (images[2.0] > 0.5)).all()
    grey = {s: ((image > 0.1) & (image < 0.9)).mean() for s, image in images.items()}
    assert grey[2.0] < grey[1.0]


def test_same_seed_same_png_bytes_and_geometry(sampler):
    png_a = sampler.sample_png(7, 5, seed=3, scale=2, pad=1)
    assert png_a == sampler.sample_png(7, 5, seed=3, scale=2, pad=1)
    assert png_a != sampler.sample_png(7, 5, seed=4, scale=2, pad=1)
    height, width = grid_shape(5, grid_columns(7, 5, None), scale=2, pad=1)
    with Image.open(BytesIO(png_a)) as image:
        assert image.mode == "L" and image.size == (width, height) == (3 * 57 + 1, 2 * 57 + 1)


def test_grid_columns_follow_the_design():
    assert grid_columns(7, 16, None) == 4
    assert grid_columns(7, 17, None) == 5
    assert grid_columns(None, 16, None) == 16
    assert grid_columns(None, 16, 4) == 4


def test_a_block_size_only_classify_cannot_keep_stays_for_drawing():
    """Reading digits is checked over its own block sizes: a classify_fn whose rows depend on
    their position in 16-row blocks loses 16 for classify alone, while decode keeps it."""
    config = presets.test()
    model = create_model(config)
    sampler = create_sampler(model, config, init_variables(model, jax.random.key(0)))
    sampler.block_sizes = sampler.classify_block_sizes = (8, 16)

    def classify_fn(variables, images):
        probabilities = np.full((len(images), 10), 0.1, np.float32)
        if len(images) == 16:  # the row's position leaks into its bits at this size only
            probabilities[:, 0] += np.arange(16, dtype=np.float32) * np.float32(1e-6)
        return probabilities

    sampler.classify_fn = classify_fn
    assert sampler.check_blocks() == ()
    assert sampler.block_sizes == (8, 16) and sampler.dropped_blocks == ()
    assert sampler.classify_block_sizes == (8,) and sampler.dropped_classify_blocks == (16,)
    images = np.zeros((20, 28, 28), np.uint8)
    np.testing.assert_array_equal(sampler.classify(images), np.full((20, 10), 0.1, np.float32))


@pytest.mark.parametrize("labels, reads_with", [("all", ROW_BY_ROW), ("20", DECODE_BLOCKS)])
def test_bayes_rule_reads_a_picture_at_a_time_and_q_with_every_block(labels, reads_with):
    """Bayes' rule (every label) reads one picture a call (the service reads one a request,
    every label's draws batched); a row's reading has the same bits alone or among 70 others.
    A few-label model's q(y|x) keeps every size."""
    config = presets.test().replace(labels=labels)
    model = create_model(config)
    sampler = create_sampler(model, config, init_variables(model, jax.random.key(0)))
    assert sampler.classify_block_sizes == reads_with
    sampler.check_blocks()  # keeps those of them that give this CPU's rows one set of bits
    assert set(sampler.classify_block_sizes) <= {*reads_with, 1}
    images = np.random.default_rng(0).integers(0, 256, (71, 28, 28), dtype=np.uint8)
    together = sampler.classify(images)
    for row in (0, 63, 64, 70):
        np.testing.assert_array_equal(together[row], sampler.classify(images[row:row + 1])[0])


def test_samplers_of_one_run_share_compiled_functions_but_draw_with_their_own_weights(
        trained_run):
    """A second sampler of the same model and config (another step, as a service moving to a
    new checkpoint) reuses the first one's jitted functions, so nothing is traced or compiled
    again; each still draws with its own step's weights, the bits of a sampler built alone."""
    from cvae.sampling.functions import sampler_functions
    from cvae.sampling.sampler import load_sampler

    first, last = trained_run.steps[0], trained_run.steps[-1]
    early = load_sampler(trained_run.directory, step=first)
    late = load_sampler(trained_run.directory, step=last)
    assert early.decode_fn is late.decode_fn and early.encode_fn is late.encode_fn
    shared = [sampler.sample_png(7, 4, seed=3) for sampler in (early, late)]
    assert shared[0] != shared[1]
    sampler_functions.cache_clear()  # each sampler with functions of its own, as before
    alone = [load_sampler(trained_run.directory, step=step).sample_png(7, 4, seed=3)
             for step in (first, last)]
    assert shared == alone
