"""The truncation's radius without SciPy: the same float32 as SciPy's `gammaincinv` gives, for
every width a model's noise has (2 to a hierarchy's tens of thousands) and quantiles from the
tails to the middle; and a cvae process that samples never imports SciPy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.special

from cvae.model.chi_quantile import chi_quantile, regularized_gamma

WIDTHS = (1, 2, 3, 5, 8, 16, 32, 64, 100, 256, 1000, 3136, 16464, 100_000)
QUANTILES = (1e-6, 0.01, 0.1, 0.5, 0.7, 0.9, 0.99, 0.999999)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_radius_is_scipys_in_float32(width):
    for quantile in QUANTILES:
        ours = chi_quantile(quantile, width)
        scipys = float(np.sqrt(2.0 * scipy.special.gammaincinv(0.5 * width, quantile)))
        assert ours == pytest.approx(scipys, rel=1e-11), (width, quantile)
        assert np.float32(ours) == np.float32(scipys), (width, quantile)


def test_the_incomplete_gamma_is_scipys_on_both_sides_of_the_mode():
    for a in (0.5, 1.0, 8.0, 500.0):
        for x in (0.0, 0.01 * a, a, a + 1, 3 * a + 10):
            assert regularized_gamma(a, x) == pytest.approx(scipy.special.gammainc(a, x),
                                                            rel=1e-12, abs=1e-300)


def test_drawing_a_truncated_grid_imports_no_scipy():
    code = ("import sys, jax, numpy as np\n"
            "from cvae.config import presets\n"
            "from cvae.model.registry import create_model, init_variables\n"
            "from cvae.sampling.sampler import create_sampler\n"
            "config = presets.get_preset('test').drawn_at(0.7)\n"
            "assert config.drawing.truncation < 1, config.drawing.truncation\n"
            "model = create_model(config)\n"
            "sampler = create_sampler(model, config, init_variables(model, jax.random.key(0)))\n"
            "assert sampler.sample_images(3, 2, 0).shape[0] == 2\n"
            "print(sorted(name for name in sys.modules if name.startswith('scipy')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
