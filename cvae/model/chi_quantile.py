"""The chi distribution's quantile (the truncation's radius), in Python floats.

SciPy's `gammaincinv` gives the same number, but importing `scipy.special` takes 0.2 to 0.3 s
(its array-API layer imports numpy.f2py and unittest), and a served model needs this one number
before it answers: a tenth of its cached start. The radius enters the sampler as a float32, and
tests/test_chi_quantile.py checks that these and SciPy's agree there.

Synopsis:

    chi_quantile(0.7, 16)          # r with P(|z| <= r) = 0.7 for z ~ N(0, I_16)
"""

from __future__ import annotations

import math
from statistics import NormalDist

_EPSILON = 1e-16  # relative size of a term, or a step, below which a float64 sum has converged
_TINY = 1e-300  # keeps the continued fraction's denominators away from zero (Lentz)
_MAX_TERMS = 100_000  # more than the series or fraction take for any width below 10^9
_MAX_STEPS = 200  # bisection alone halves a float64 bracket to nothing in ~2,100: Newton leads


def regularized_gamma(a: float, x: float) -> float:
    """P(a, x) = γ(a, x) / Γ(a), the lower regularized incomplete gamma function: the series
    below the mode, 1 - Q(a, x) by its continued fraction above it (each converges fast there)."""
    if x <= 0:
        return 0.0
    log_scale = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        for n in range(1, _MAX_TERMS):
            term *= x / (a + n)
            total += term
            if term < total * _EPSILON:
                break
        return total * math.exp(log_scale)
    b = x + 1 - a  # Q(a, x)'s continued fraction, by the modified Lentz method
    c, d = 1 / _TINY, 1 / b
    fraction = d
    for n in range(1, _MAX_TERMS):
        numerator = -n * (n - a)
        b += 2
        d = numerator * d + b
        d = 1 / (d if abs(d) > _TINY else _TINY)
        c = b + numerator / c
        c = c if abs(c) > _TINY else _TINY
        fraction *= d * c
        if abs(d * c - 1) < _EPSILON:
            break
    return 1 - math.exp(log_scale) * fraction


def gamma_quantile(a: float, q: float) -> float:
    """x with P(a, x) = q, 0 < q < 1: Newton's steps kept inside a bracket that shrinks every
    step (a bisection where Newton would leave it), from the Wilson-Hilferty guess."""
    z = NormalDist().inv_cdf(q)
    x = a * max(1 - 1 / (9 * a) + z / (3 * math.sqrt(a)), 0.1) ** 3
    low, high = 0.0, math.inf
    for _ in range(_MAX_STEPS):
        error = regularized_gamma(a, x) - q
        if error < 0:
            low = x
        else:
            high = x
        density = math.exp((a - 1) * math.log(x) - x - math.lgamma(a))
        newton = x - error / density if density > 0 else math.nan
        inside = low < newton < high
        following = newton if inside else (2 * x if math.isinf(high) else (low + high) / 2)
        if abs(following - x) <= _EPSILON * x:
            return following
        x = following
    return x


def chi_quantile(quantile: float, width: int) -> float:
    """The radius within which a share `quantile` (0 < quantile < 1) of N(0, I_width) lies:
    |z|^2 / 2 is Gamma(width / 2)-distributed."""
    return math.sqrt(2 * gamma_quantile(0.5 * width, quantile))
