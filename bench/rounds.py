"""Interleaved rounds: the one way the benchmarks compare A with B.

    results = interleaved({"a": run_a, "b": run_b}, rounds=5)   # {"a": [r0, r1, ...], ...}
    median_ratio(rates(results["a"]), rates(results["b"]))

A shared machine's speed drifts by 20-30% within minutes, so timing all of A and then all of B
measures the drift as much as the difference. Each round runs every candidate once, the order
reversed every other round (A B C, C B A, ...) so no candidate always follows the same one, and a
ratio is the median over rounds of the per-round ratio: each ratio compares runs made within
seconds of each other.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
RATIO_RULE = "median over interleaved rounds of the per-round ratio"


def interleaved(candidates: dict[K, Callable[[], T]], rounds: int,
                pause: float = 0.0) -> dict[K, list[T]]:
    """Calls every candidate once per round, alternating the order; `pause` seconds before each
    call let the previous one's thread pools go idle."""
    results: dict[K, list[T]] = {name: [] for name in candidates}
    order = list(candidates)
    for round_index in range(rounds):
        for name in order if round_index % 2 == 0 else reversed(order):
            time.sleep(pause)
            results[name].append(candidates[name]())
    return results


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """`fn` as a callable that returns its wall time in seconds."""
    def call() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return call


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Median of a[i] / b[i] over rounds i (the two lists come from the same rounds)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"per-round ratios need rounds of both sides, got {len(a)} and {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b))
