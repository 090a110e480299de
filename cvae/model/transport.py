"""Moving a code from one class's region of the latent space to another's, for label swaps.

With the standard prior every class shares N(0, I), and a digit's code z, decoded with another
label, already lies where the decoder saw codes of that label. With a per-class mixture prior
(`cvae.model.prior`, fitted to each class's codes) the classes occupy different regions, and a
class-a code decoded with label b is off the decoder's map for b (without the transport, 92.6%
of the default checkpoint's swaps read as b). So a code is carried over first: each class's
mixture is summarised by one Gaussian (its mean and
covariance), and z moves by the optimal-transport map between class a's Gaussian and class b's,

    T(z) = m_b + A (z - m_a),  A = S_a^-1/2 (S_a^1/2 S_b S_a^1/2)^1/2 S_a^-1/2,

the map that sends N(m_a, S_a) to N(m_b, S_b) moving points least on average (Knott and Smith
1984): z keeps its place relative to its class, which is what is left of the hand. It is the
identity from a class to itself, and for the standard prior.

Synopsis:

    transport = class_transport(config, variables)        # None for the standard prior
    z_b = transport.apply(z, source=labels_a, target=labels_b)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cvae.model import prior as prior_lib
def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def class_moments(mixture: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each class's mixture as one Gaussian: (means f64[K, L], covariances f64[K, L, L])."""
    weights, means, tril = (np.asarray(mixture[k], np.float64)
                            for k in ("weights", "means", "scale_tril"))
    mean = np.einsum("kc,kcl->kl", weights, means)
    second = tril @ np.swapaxes(tril, -1, -2) + means[..., :, None] * means[..., None, :]
    covariance = np.einsum("kc,kcij->kij", weights, second) - mean[:, :, None] * mean[:, None, :]
    return mean, covariance


def gaussian_transport(cov_a: np.ndarray, cov_b: np.ndarray) -> np.ndarray:
    """A of the optimal-transport map between N(., cov_a) and N(., cov_b) (module docstring)."""
    root_a = _sqrt_psd(cov_a)
    inverse_root_a = np.linalg.inv(root_a)
    return inverse_root_a @ _sqrt_psd(root_a @ cov_b @ root_a) @ inverse_root_a


@dataclasses.dataclass(frozen=True)
class ClassTransport:
    means: np.ndarray  # f64[K, L]
    maps: np.ndarray  # f64[K, K, L, L]: maps[a, b] carries class a's Gaussian onto class b's

    def apply(self, z: np.ndarray, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        """f32[N, L] codes of classes `source` i[N] -> the codes for labels `target` i[N];
        rows whose source is their target come back unchanged, bit for bit, and a row's
        result does not depend on the other rows."""
        out = np.array(z, np.float32, copy=True)
        source, target = np.asarray(source), np.asarray(target)
        for a, b in set(zip(source.tolist(), target.tolist())):
            if a == b:
                continue
            rows = (source == a) & (target == b)
            offset = z[rows].astype(np.float64) - self.means[a]
            # maps[a, b] @ offset, row by row: an elementwise product summed along each row
            # is the same arithmetic for every row, while a matrix product's kernel (BLAS)
            # may round a row differently by how many rows it is given.
            moved = self.means[b] + np.sum(self.maps[a, b] * offset[:, None, :], axis=-1)
            out[rows] = moved.astype(np.float32)
        return out


def class_transport(config, variables: dict) -> ClassTransport | None:
    """The transport of a model with a mixture prior; None for a prior without one."""
    if not config.prior.component.draws_from_mixture:
        return None
    means, covariances = class_moments(variables[prior_lib.COLLECTION][prior_lib.VARIABLE])
    classes = len(means)
    maps = np.stack([np.stack([gaussian_transport(covariances[a], covariances[b])
                               for b in range(classes)]) for a in range(classes)])
    return ClassTransport(means, maps)
