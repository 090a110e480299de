"""The sampler's truncation: a noise vector longer than N(0, I)'s q-quantile radius is pulled in
onto it, after its mixture component is chosen; a shorter one is drawn as before, bit for bit,
through every prior and the ladder."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastapi.testclient import TestClient

from cvae.config import presets
from cvae.cli.main import main as cvae_main
from cvae.model import prior
from cvae.model.registry import create_model, init_variables
from cvae.export.load import open_sampler
from cvae.sampling.sampler import create_sampler
from service.app import create_app


def test_the_radius_holds_its_quantile_and_only_longer_rows_move():
    noise = np.random.default_rng(0).normal(size=(200_000, 16)).astype(np.float32)
    radius = prior.truncation_radius(0.7, 16)
    length = np.linalg.norm(noise, axis=1)
    assert np.mean(length <= radius) == pytest.approx(0.7, abs=0.005)
    out = np.asarray(jax.jit(prior.truncate, static_argnums=1)(noise, radius))
    inside = length <= radius
    assert np.array_equal(out[inside].view(np.uint32), noise[inside].view(np.uint32))
    np.testing.assert_allclose(np.linalg.norm(out[~inside], axis=1), radius, rtol=1e-5)
    cosine = np.sum(out[~inside] * noise[~inside], axis=1) / (radius * length[~inside])
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-5)  # the same direction, shorter
    assert prior.truncation_radius(1.0, 16) is None
    assert prior.truncate(noise, None) is noise


def _lengths_added_in_halves(rows: np.ndarray) -> np.ndarray:
    """The order `prior.row_lengths` promises, in numpy: halves added elementwise, padded."""
    squares = np.square(rows)
    while squares.shape[-1] > 1:
        half = -(-squares.shape[-1] // 2)
        rest = np.pad(squares[:, half:], [(0, 0), (0, 2 * half - squares.shape[-1])])
        squares = squares[:, :half] + rest
    return np.sqrt(squares)


@pytest.mark.parametrize("width", [16, 13, 1])
def test_a_rows_length_has_the_same_bits_in_every_block_size(width):
    """Summed in one fixed order, so in blocks of 64 rows and of 1,024 (where XLA's CPU reduce
    took another kernel on a 2-core AMD EPYC) a row's length, and so its truncation, is the
    same: numpy's elementwise adds, bit for bit."""
    rows = np.random.default_rng(width).normal(size=(1024, width)).astype(np.float32)
    expected = _lengths_added_in_halves(rows).view(np.uint32)
    radius = prior.truncation_radius(0.7, width)
    lengths, truncated = jax.jit(prior.row_lengths), jax.jit(prior.truncate, static_argnums=1)
    for size in (64, 1024):
        blocks = range(0, len(rows), size)
        got = np.concatenate([np.asarray(lengths(rows[i:i + size])) for i in blocks])
        assert np.array_equal(got.view(np.uint32), expected)
        pulled = np.concatenate([np.asarray(truncated(rows[i:i + size], radius)) for i in blocks])
        if size == 64:
            first = pulled
        assert np.array_equal(pulled.view(np.uint32), first.view(np.uint32))


def test_a_truncated_draw_keeps_its_component():
    """Components 100 apart, so each z says which one drew it."""
    classes, components, width = 10, 4, 3
    mixture = {"weights": jnp.full((classes, components), 1.0 / components),
               "means": jnp.broadcast_to(100.0 * jnp.arange(components)[:, None],
                                         (classes, components, width)),
               "scale_tril": jnp.broadcast_to(jnp.eye(width), (classes, components, width, width))}
    noise = jax.random.normal(jax.random.key(0), (5000, width)) * 2.0
    labels = jnp.arange(5000) % classes
    radius = prior.truncation_radius(0.5, width)
    plain = prior.sample(mixture, noise, labels)
    cut = prior.sample(mixture, noise, labels, radius=radius)
    np.testing.assert_array_equal(np.round(plain / 100)[:, 0], np.round(cut / 100)[:, 0])
    offset = np.asarray(cut) - 100.0 * np.round(np.asarray(cut) / 100)
    assert np.all(np.linalg.norm(offset, axis=1) <= radius * (1 + 1e-4))
    inside = np.linalg.norm(np.asarray(noise), axis=1) <= radius
    assert 0 < inside.sum() < len(inside)
    np.testing.assert_allclose(offset[inside], np.asarray(noise)[inside], atol=1e-4)


@pytest.mark.parametrize("changes", [
    {"prior": "standard"},
    {"prior": "mixture", "prior_components": 3},
    {"prior": "mixture", "prior_components": 2, "model": "ladder", "stochastic_layers": 2,
     "upper_latent_dim": 3},
], ids=["standard", "mixture", "ladder"])
def test_the_sampler_draws_short_noise_as_before_and_pulls_in_the_rest(changes):
    config = presets.test().replace(**changes)
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    plain = create_sampler(model, config, variables, block_rows=64)
    cut = create_sampler(create_model(config.replace(truncation=0.5)),
                         config.replace(truncation=0.5), variables, block_rows=64)
    noise = np.asarray(jax.random.normal(jax.random.key(1), (64, plain.noise_dim)))
    labels = np.arange(64, dtype=np.int32) % 10
    top = noise[:, :plain.code_dim]  # the share the prior maps (the ladder's top layer)
    inside = np.linalg.norm(top, axis=1) <= prior.truncation_radius(0.5, plain.code_dim)
    assert 10 < inside.sum() < 54
    same = np.array_equal  # bit for bit, row by row
    plain_images, cut_images = plain.decode(noise, labels), cut.decode(noise, labels)
    assert all(same(plain_images[i], cut_images[i]) for i in np.flatnonzero(inside))
    assert not any(same(plain_images[i], cut_images[i]) for i in np.flatnonzero(~inside))
    codes = cut.to_codes(noise, labels)
    assert all(same(plain.to_codes(noise, labels)[i], codes[i]) for i in np.flatnonzero(inside))


def test_cvae_sample_draws_at_the_truncation_asked(trained_run, tmp_path, capsys):
    """`cvae sample --truncation Q`: the same weights drawn at Q, the PNG bytes of a sampler
    whose config says Q; its own truncation gives the bytes of no flag; out of (0, 1] exits 2
    naming the range, writing nothing."""
    own = trained_run.config.drawing.truncation
    pngs = {}
    for name, flags in {"none": [], "own": ["--truncation", str(own)],
                        "cut": ["--truncation", "0.3"]}.items():
        out = tmp_path / f"{name}.png"
        assert cvae_main(["sample", "--checkpoint-dir", str(trained_run.directory), "--digit",
                          "3", "--n", "16", "--out", str(out), *flags]) == 0
        pngs[name] = out.read_bytes()
    assert pngs["own"] == pngs["none"] != pngs["cut"]
    sampler = open_sampler(trained_run.directory)
    config = sampler.config.replace(truncation=0.3)
    cut = create_sampler(create_model(config), config, sampler.variables, step=sampler.step)
    assert pngs["cut"] == cut.sample_png(3, 16, 0)
    for bad in ("0", "1.5", "most"):
        with pytest.raises(SystemExit) as exited:
            cvae_main(["sample", "--truncation", bad, "--out", str(tmp_path / "bad.png")])
        assert exited.value.code == 2
        assert "--truncation" in capsys.readouterr().err
    assert not (tmp_path / "bad.png").exists()


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_cvae_serve_truncation_draws_every_step_at_it_under_its_own_etag(trained_run):
    """`cvae serve --truncation Q` (create_app's `truncation`): /sample's bytes are `cvae
    sample --truncation Q`'s, /readyz says Q, and the ETag differs from the run's own drawing,
    so no cache mixes the two."""
    offline = open_sampler(trained_run.directory, truncation=0.3).sample_png(3, 16, 0)
    etags = {}
    for truncation in (None, 0.3):
        with TestClient(create_app(trained_run.directory, poll_interval=3600,
                                   truncation=truncation)) as client:
            response = client.get("/sample?digit=3&n=16&seed=0")
            assert response.status_code == 200
            etags[truncation] = response.headers["etag"]
            served = client.get("/readyz").json()["config"]["truncation"]
        assert served == (trained_run.config.drawing.truncation if truncation is None
                          else truncation)
    assert response.content == offline
    assert etags[None] != etags[0.3]


@pytest.mark.slow  # a variant's journey end to end: `make test-slow`
def test_cvae_export_truncation_exports_the_weights_drawn_at_it(trained_run, data_dir, tmp_path,
                                                                capsys):
    """`cvae export --truncation Q`: the folder's config says Q, its sampler gives `cvae sample
    --truncation Q`'s bytes (its StableHLO and ONNX verified against that sampler at export),
    and its card shows `cvae eval`'s figures only once they are drawn at Q too (`cvae eval
    --truncation Q`, recorded in the JSON's config), naming that command until then."""
    from cvae.evaluation.run import EvalOptions, run_eval
    from cvae.export.run import export_checkpoint

    run, folder = trained_run.copy_to(tmp_path / "run"), tmp_path / "cut"
    eval_json, quick = run / "eval.json", ["--no-fidelity", "--iwae-k", "10", "--test-limit", "32"]
    run_eval(run, data_dir, EvalOptions(iwae_k=10, test_limit=32, fidelity=False),
             json_path=eval_json)  # the run's own drawing
    export_checkpoint(run, folder, truncation=0.3, log=lambda message: None)
    exported = open_sampler(folder)
    assert exported.config == trained_run.config.replace(truncation=0.3)
    assert exported.sample_png(3, 16, 0) == open_sampler(run, truncation=0.3).sample_png(3, 16, 0)
    card = (folder / "README.md").read_text()
    sharpness, own = (trained_run.config.drawing.pixel_sharpness,
                      trained_run.config.drawing.truncation)
    assert (f"No figures here: {eval_json} scored samples drawn with truncation {own!r}, "
            f"pixel_sharpness {sharpness!r}, this export draws with truncation 0.3, "
            f"pixel_sharpness {sharpness!r}; run `cvae eval --checkpoint-dir {run} --json "
            f"{eval_json} --truncation 0.3 --pixel-sharpness {sharpness!r}`") in card
    assert "--truncation 0.3" in card  # the train command that makes this config

    capsys.readouterr()
    assert cvae_main(["eval", "--checkpoint-dir", str(run), "--data-dir", str(data_dir),
                      "--json", str(eval_json), *quick, "--truncation", "0.3"]) == 0
    assert f"samples drawn at truncation 0.3, sharpness {sharpness!r}\n" in capsys.readouterr().out
    assert json.loads(eval_json.read_text())["config"] == exported.config.to_dict()
    export_checkpoint(run, folder, truncation=0.3, force=True, log=lambda message: None)
    assert f"From `cvae eval` ({eval_json}) on 32 test examples" in \
        (folder / "README.md").read_text()
