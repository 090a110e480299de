"""A per-class Gaussian-mixture prior over z, fitted to the encoder's codes after training.

Why: at beta 1 the codes of each digit do not fill N(0, I); z drawn from N(0, I) often lands
where the decoder has only seen other digits, and it draws the wrong digit or a blend. Fitting a
mixture to the aggregate posterior q(z | y) of each class and sampling from it instead
(ex-post density estimation, Ghosh et al. 2020, "From variational to deterministic
autoencoders") puts samples where the decoder was trained. Training is unchanged: the loss keeps
KL(q || N(0, I)); `cvae eval`'s IWAE bounds use the fitted mixture as p(z | y), a valid prior,
so the likelihood reported is that of the model that draws the samples.

Sampling stays a function of one standard-normal vector `noise` of size latent_dim, so the
sampler and the service need nothing new: the mixture component is read from the fractional
part of 1000 * noise[0] (uniform, and independent of the noise's magnitude, whatever the
temperature), and z = mean_c + L_c @ noise, L_c the Cholesky factor of component c's covariance.
So temperature t (noise ~ N(0, t^2 I)) narrows each component, not the choice among them.
A truncation (`Config.truncation`, a quantile q < 1) then pulls a noise vector longer than
N(0, I)'s q-quantile radius in onto that radius, after the component is chosen: the samples that
a classifier reads as another digit sit mostly in the components' tails (docs/model.md).

Parameters, in the flax variable collection "prior" as variable "mixture": weights f32[K, C] (K
the dataset's classes), means f32[K, C, L], scale_tril f32[K, C, L, L].
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cvae.data.pixels import to_unit
from cvae.model.binarization import binarize
from cvae.model.chi_quantile import chi_quantile
from cvae.model.densities import LOG_2PI

COLLECTION, VARIABLE = "prior", "mixture"  # variables["prior"]["mixture"] holds the mixture
_COMPONENT_SCALE = 1000.0  # frac(1000 * noise[0]) picks the component
_COVARIANCE_FLOOR = 1e-4  # added to each covariance's diagonal: no component collapses


def standard_mixture(num_classes: int, components: int, latent_dim: int) -> dict:
    """Every component N(0, I) with equal weight: the standard prior, before any fit.

    float32 like a fitted mixture's weights, not a Python float's weak type: with weak weights,
    the first epoch's train chunk and prior fit were traced and compiled once more for the
    fitted (strong) weights of every later epoch."""
    return {"weights": jnp.full((num_classes, components), 1.0 / components, jnp.float32),
            "means": jnp.zeros((num_classes, components, latent_dim)),
            "scale_tril": jnp.broadcast_to(jnp.eye(latent_dim),
                                           (num_classes, components, latent_dim, latent_dim))}


def truncation_radius(quantile: float, width: int) -> float | None:
    """The radius that a share `quantile` of N(0, I_width) draws lie within (the chi
    distribution's quantile); None for quantile 1, no truncation."""
    return None if quantile >= 1 else chi_quantile(quantile, width)


def truncate(noise: jax.Array, radius: float | None) -> jax.Array:
    """Rows of noise f32[B, L] longer than `radius` scaled onto it; the others as they are
    (bit for bit); None: all as they are."""
    if radius is None:
        return noise
    return noise * (radius / jnp.maximum(row_lengths(noise), radius))  # short: radius / radius


def row_lengths(rows: jax.Array) -> jax.Array:
    """Euclidean length of each row, f32[B, L] -> f32[B, 1], the squares added in halves, a
    fixed order that no block size changes: XLA's CPU reduce is compiled per shape (on a 2-core
    AMD EPYC a YNNPACK reduce from 256 rows, a loop below), and the two summed a row's squares
    in other orders, so a truncated row's bits depended on the block it was decoded in."""
    squares = jnp.square(rows)
    while squares.shape[-1] > 1:
        half = -(-squares.shape[-1] // 2)
        rest = squares[..., half:]
        squares = squares[..., :half] + jnp.pad(rest, [(0, 0)] * (rest.ndim - 1)
                                                 + [(0, half - rest.shape[-1])])
    return jnp.sqrt(squares)


def sample(prior: dict, noise: jax.Array, labels: jax.Array, *,
           radius: float | None = None) -> jax.Array:
    """z for each row: noise f32[B, L] (N(0, t^2 I)), labels i32[B] -> f32[B, L]; the component
    from the noise as drawn, the offset from it `truncate`d to `radius`."""
    weights, means, tril = (prior["weights"][labels], prior["means"][labels],
                            prior["scale_tril"][labels])
    uniform = jnp.mod(noise[:, 0] * _COMPONENT_SCALE, 1.0)
    edges = jnp.cumsum(weights, axis=-1)
    component = jnp.minimum(jnp.sum(uniform[:, None] >= edges, axis=-1), last_drawn(weights))
    take = jax.vmap(lambda array, c: array[c])
    return take(means, component) + jnp.einsum("bij,bj->bi", take(tril, component),
                                               truncate(noise, radius))


def last_drawn(weights: jax.Array) -> jax.Array:
    """The last component of each row's class with a weight, f32[B, C] -> i32[B]: where the
    cumulative weights round below 1, a uniform above them falls there, not past it."""
    return jnp.sum(weights > 0, axis=-1) - 1


def mixture_of(prior, variables: dict) -> dict | None:
    """The mixture that `draw` samples for a model whose prior is `prior`
    (`cvae.model.priors`), from its variables; None for a prior without one."""
    return variables[COLLECTION][VARIABLE] if prior.draws_from_mixture else None


def draw(noise: jax.Array, labels: jax.Array, *, mixture: dict | None, truncation: float,
         sample_fn: Callable = sample) -> jax.Array:
    """z for each row of noise f32[B, L] through the configured prior, truncated at the quantile
    `truncation`: the noise itself for the standard prior (mixture None), else `sample_fn`
    (`sample`, or the export's ONNX-friendly copy of it) from the mixture."""
    radius = truncation_radius(truncation, noise.shape[-1])
    if mixture is None:
        return truncate(noise, radius)
    return sample_fn(mixture, noise, labels, radius=radius)


def log_density(prior: dict, z: jax.Array, labels: jax.Array) -> jax.Array:
    """log p(z | y) under the mixture: z f32[B, L], labels i32[B] -> f32[B]."""
    return log_density_batched(prior, z, labels)


def log_density_batched(prior: dict, z: jax.Array, labels: jax.Array) -> jax.Array:
    """log p(z | y) under the mixture: z f32[..., B, L] (leading axes, such as importance
    samples, share the labels i32[B]) -> f32[..., B]. The factors are inverted once a call,
    for the classes' components, not once a row."""
    inverse = _inverse_tril(prior["scale_tril"])[labels]  # [B, C, L, L]
    means = prior["means"][labels]
    log_det = jnp.sum(jnp.log(jnp.diagonal(prior["scale_tril"], axis1=-2, axis2=-1)),
                      axis=-1)[labels]  # [B, C]
    solved = jnp.einsum("bcij,...bcj->...bci", inverse, z[..., None, :] - means)
    log_normal = -0.5 * jnp.sum(jnp.square(solved), axis=-1) - log_det \
        - 0.5 * z.shape[-1] * LOG_2PI
    return jax.nn.logsumexp(jnp.log(prior["weights"][labels]) + log_normal, axis=-1)


def create_fit_fn(encode_fn, *, components: int, codes: str = "samples",
                  batch_size: int = 1000, binarized: bool = True):
    """`fit_fn(variables, images_u8 u8[N, P], table, mask, key) -> prior` for a model whose
    `encode_fn(variables, images f32[B, P], labels) -> (mean, logvar)`, P = H * W * C.

    One code per training image, from a binarised copy of it (the encoder is trained on
    binarised digits): with codes="samples" a draw z ~ q(z | x, y), so the mixture fits the
    aggregate posterior (the default and the likelihood preset: the density IWAE needs, and wider
    samples); with codes="means" the posterior mean, so the mixture fits the centres of the
    codes and samples come out a little more typical (docs/model.md). Then `fit` per class,
    with each code's posterior variance, so that no component is narrower than the posteriors
    it stands for.
    """
    if codes not in ("samples", "means"):
        raise ValueError(f"codes={codes!r}: allowed samples, means")

    @jax.jit
    def fit_fn(variables, images_u8, labels, table, mask, key):
        binarize_key, noise_key, fit_key = jax.random.split(key, 3)
        n = images_u8.shape[0]
        size = min(batch_size, n)
        padding = -n % size  # padded rows get codes too, but no class table points at them
        images_u8 = jnp.pad(images_u8, ((0, padding), (0, 0)))
        labels = jnp.pad(labels, (0, padding))

        def codes_of(start):
            rows = to_unit(jax.lax.dynamic_slice_in_dim(images_u8, start, size))
            x = binarize(jax.random.fold_in(binarize_key, start), rows) if binarized else rows
            mean, logvar = encode_fn(variables, x,
                                     jax.lax.dynamic_slice_in_dim(labels, start, size))
            if codes == "means":
                return mean, jnp.exp(logvar)
            noise = jax.random.normal(jax.random.fold_in(noise_key, start), mean.shape)
            return mean + jnp.exp(0.5 * logvar) * noise, jnp.exp(logvar)

        found, variances = jax.lax.map(codes_of, jnp.arange(0, n + padding, size))
        width = found.shape[-1]
        return fit(found.reshape(-1, width), table, mask, fit_key, components,
                   variances=variances.reshape(-1, width), codes_are_draws=codes == "samples")

    return fit_fn


def class_index_table(labels: np.ndarray, num_classes: int, width_multiple: int = 1
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of each class, padded to the largest class (rounded up to a multiple of
    `width_multiple`): (i32[K, M], mask bool[K, M])."""
    labels = np.asarray(labels)
    groups = [np.flatnonzero(labels == c) for c in range(num_classes)]
    width = max(1, max(len(g) for g in groups))
    width = -(-width // width_multiple) * width_multiple
    table = np.zeros((num_classes, width), np.int32)
    mask = np.zeros((num_classes, width), bool)
    for c, group in enumerate(groups):
        table[c, :len(group)], mask[c, :len(group)] = group, True
    return table, mask


# EM steps per fit: about 20 ms each for 50,000 16-d codes and 10 x 10 components on 2 CPU
# cores, so a fit adds about 0.6 s to each evaluation.
EM_ITERATIONS = 30
MIN_CODES_PER_DIMENSION = 2  # codes a component needs per latent dimension (see `fit`)


@functools.partial(jax.jit, static_argnames=("components", "iterations", "codes_are_draws"))
def fit(codes: jax.Array, table: jax.Array, mask: jax.Array, key: jax.Array, components: int,
        iterations: int = EM_ITERATIONS, *, variances: jax.Array | None = None,
        codes_are_draws: bool = True) -> dict:
    """EM for a full-covariance mixture per class. codes f32[N, L]; table, mask from
    `class_index_table`. A class of fewer than `MIN_CODES_PER_DIMENSION * L` codes a component
    fits fewer components (at least one); the others keep weight 0 and are never drawn.

    variances f32[N, L], each code's posterior variance, floors every component: along each of
    its principal axes its variance is at least its codes' mean posterior variance there
    (weighted by responsibility). Without it, a dimension the model does not use (codes at one
    point) or a direction a small class's codes do not span collapses onto the 1e-4 floor, and
    the posterior draws that `cvae eval` scores lie thousands of nats outside the prior. Draws
    (codes_are_draws) already spread as their posteriors do, so there the floor applies only to
    a class too small for one component's codes a dimension; posterior means (codes_are_draws
    False) are floored in every class."""

    def floored(covs, r, v, mass, applies):
        """covs [C, L, L] with each principal variance raised to the posterior's along it."""
        if v is None:
            return covs
        def raise_to_posterior(covs):
            mean_variance = (r.T @ v) / mass[:, None]  # [C, L]: a diagonal posterior covariance
            eigenvalues, axes = jnp.linalg.eigh(covs)
            along = jnp.einsum("cli,cl->ci", jnp.square(axes), mean_variance)
            return jnp.einsum("cij,cj,ckj->cik", axes, jnp.maximum(eigenvalues, along), axes)

        # A branch, not a select: a class the floor does not touch (every class of the
        # default's fit) skips the eigendecompositions in each EM step.
        return jax.lax.cond(applies, raise_to_posterior, lambda covs: covs, covs)

    def one_class(args):
        rows, valid, class_key = args
        x, w = codes[rows], valid.astype(codes.dtype)  # [M, L], [M]
        v = None if variances is None else variances[rows]
        count = jnp.maximum(jnp.sum(w), 1.0)
        applies = jnp.logical_not(codes_are_draws) | (
            count < MIN_CODES_PER_DIMENSION * x.shape[1])
        # Start: the means of `components` distinct random members, the class covariance.
        scores = jnp.where(valid, jax.random.uniform(class_key, valid.shape), 2.0)
        # (cycling through the members when the widest class has fewer rows than components)
        start = x[jnp.argsort(scores)[jnp.arange(components) % x.shape[0]]]
        centred = x - jnp.sum(w[:, None] * x, axis=0) / count
        cov = (w[:, None] * centred).T @ centred / count + _COVARIANCE_FLOOR * jnp.eye(x.shape[1])
        cov = floored(cov[None], w[:, None], v, count[None], applies)[0]
        # A component needs several codes a dimension, or its covariance collapses onto the
        # floor and the density is a spike no other code reaches: small classes get fewer.
        usable = jnp.clip(jnp.floor(count / (MIN_CODES_PER_DIMENSION * x.shape[1])), 1,
                          components)
        active = jnp.arange(components) < usable
        state = (jnp.where(active, 1.0 / usable, 0.0), start,
                 jnp.broadcast_to(cov, (components,) + cov.shape))

        def em_step(_, state):
            weights, means, covs = state
            tril = jnp.linalg.cholesky(covs)
            log_r = jnp.log(weights) + _log_normal(x, means, tril)  # [M, C]
            r = jax.nn.softmax(log_r, axis=-1) * w[:, None]
            mass = jnp.sum(r, axis=0) + 1e-6
            means = (r.T @ x) / mass[:, None]
            diff = x[None, :, :] - means[:, None, :]  # [C, M, L]
            covs = jnp.einsum("cmi,cmj->cij", r.T[:, :, None] * diff, diff) / mass[:, None, None]
            covs = floored(covs + _COVARIANCE_FLOOR * jnp.eye(x.shape[1]), r, v, mass, applies)
            mass = jnp.where(active, mass, 0.0)
            return mass / jnp.sum(mass), means, covs

        weights, means, covs = jax.lax.fori_loop(0, iterations, em_step, state)
        return weights, means, jnp.linalg.cholesky(covs)

    keys = jax.random.split(key, table.shape[0])
    weights, means, tril = jax.lax.map(one_class, (table, mask, keys))
    return {"weights": weights, "means": means, "scale_tril": tril}


def _inverse_tril(tril: jax.Array) -> jax.Array:
    """L^-1 for a stack of small lower-triangular factors [..., L, L] (one solve each), so
    densities below are plain matrix products: XLA:CPU's batched triangular solve over many
    right-hand sides was two orders of magnitude slower."""
    eye = jnp.broadcast_to(jnp.eye(tril.shape[-1], dtype=tril.dtype), tril.shape)
    return jax.scipy.linalg.solve_triangular(tril, eye, lower=True)


def _log_normal(x: jax.Array, means: jax.Array, tril: jax.Array) -> jax.Array:
    """log N(x_m; means_c, L_c L_c^T): x [M, L], means [C, L], tril [C, L, L] -> [M, C]."""
    diff = x[None, :, :] - means[:, None, :]  # [C, M, L]
    solved = jnp.einsum("cij,cmj->cmi", _inverse_tril(tril), diff)
    log_det = jnp.sum(jnp.log(jnp.diagonal(tril, axis1=-2, axis2=-1)), axis=-1)
    return (-0.5 * jnp.sum(jnp.square(solved), axis=-1) - log_det[:, None]
            - 0.5 * x.shape[1] * LOG_2PI).T
