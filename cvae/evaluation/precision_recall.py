"""Improved precision and recall (Kynkäänniemi et al. 2019) and coverage (Naeem et al. 2020).

Fréchet distance folds sharpness and variety into one number; these separate them. Each set of
feature vectors approximates its manifold by the union of balls around its points, each ball
reaching the point's k-th nearest neighbour within its own set:

- precision: the share of generated points inside the real manifold (are samples realistic?);
- recall: the share of real points inside the generated manifold (is the variety covered?);
- coverage: the share of real points whose own ball holds a generated point (recall that one
  outlying sample with a huge ball cannot inflate).

Two halves of the same data score about 1 on all three; samples far from the data score 0.
Written with NumPy rather than the `prdc` package (last released 2020, pulls scikit-learn):
it is one chunked distance matrix. No JAX here, so the tests run instantly.
"""

from __future__ import annotations

import numpy as np

# k of the k-th nearest neighbour: the papers' recommended values.
PRECISION_RECALL_K = 3  # Kynkäänniemi et al. 2019
COVERAGE_K = 5  # Naeem et al. 2020
_CHUNK_ROWS = 1024  # rows of the distance matrix held at once (memory, not the result)


def _squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64[len(a), len(b)] of squared Euclidean distances, never negative."""
    sq = (np.sum(a * a, axis=1)[:, None] + np.sum(b * b, axis=1)[None, :] - 2.0 * (a @ b.T))
    return np.maximum(sq, 0.0)


def _row_blocks(queries: np.ndarray, support: np.ndarray):
    """(row slice, squared distances of those query rows to all support points), chunked."""
    queries, support = np.asarray(queries, np.float64), np.asarray(support, np.float64)
    for start in range(0, len(queries), _CHUNK_ROWS):
        rows = slice(start, min(start + _CHUNK_ROWS, len(queries)))
        yield rows, _squared_distances(queries[rows], support)


def knn_radii(features: np.ndarray, k: int) -> np.ndarray:
    """Squared distance from each point to its k-th nearest other point of the same set: [N]."""
    if not 1 <= k < len(features):
        raise ValueError(f"k={k}: need 1 <= k < number of points ({len(features)})")
    radii = np.empty(len(features))
    for rows, block in _row_blocks(features, features):
        # Column k of the sorted row: column 0 is the point itself (distance 0).
        radii[rows] = np.partition(block, k, axis=1)[:, k]
    return radii


def inside_manifold(queries: np.ndarray, support: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """bool[len(queries)]: whether each query lies in some ball (support[j], radii[j])."""
    inside = np.empty(len(queries), bool)
    for rows, block in _row_blocks(queries, support):
        inside[rows] = np.any(block <= radii[None, :], axis=1)
    return inside


def nearest_distances(queries: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Squared distance from each query to its nearest support point: float64[len(queries)]."""
    nearest = np.empty(len(queries))
    for rows, block in _row_blocks(queries, support):
        nearest[rows] = block.min(axis=1)
    return nearest


def precision_recall(real: np.ndarray, generated: np.ndarray, *, k: int = PRECISION_RECALL_K,
                     coverage_k: int = COVERAGE_K) -> dict[str, float]:
    """{"precision", "recall", "coverage"} of `generated` against `real`, feature arrays [N, D]."""
    real = np.asarray(real, np.float64)
    generated = np.asarray(generated, np.float64)
    precision = inside_manifold(generated, real, knn_radii(real, k))
    recall = inside_manifold(real, generated, knn_radii(generated, k))
    # Coverage: real point i counts when some sample falls inside real point i's own ball.
    covered = nearest_distances(real, generated) <= knn_radii(real, coverage_k)
    return {"precision": float(precision.mean()), "recall": float(recall.mean()),
            "coverage": float(covered.mean())}
