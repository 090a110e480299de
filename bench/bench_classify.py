"""`/classify` by Bayes' rule: its latency at concurrency 1 over HTTP, beside its FLOP bound.

A model trained with every label reads an upload as argmax_y of its IWAE bounds on
log p(x | y), every label's draws in one batched call (cvae/model/objectives.py). The bound is
the reading's FLOPs (XLA's own count for the compiled program) at the machine's measured GEMM
rate: no reading can be faster than that on this machine. Run by `bench/run.py`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile

from bench.bench_service import drawing_png, post_script
from bench.servers import free_port, running, wrk

SECONDS, REPEATS = 5.0, 3


def reading_flops(checkpoint_dir: str) -> float:
    """FLOPs of one picture's Bayes-rule reading, as XLA counts the compiled program."""
    import jax
    import numpy as np

    from cvae.sampling.sampler import load_sampler

    sampler = load_sampler(checkpoint_dir)
    images = np.zeros((1, sampler.image_pixels), np.float32)
    compiled = jax.jit(sampler.classify_fn).lower(sampler.variables, images).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return float(analysis["flops"])


def measure(checkpoint_dir: str, seconds: float = SECONDS, repeats: int = REPEATS) -> dict:
    """p50 and p99 of POST /classify at concurrency 1 (medians of `repeats` wrk runs)."""
    port = free_port()
    command = [sys.executable, "-m", "cvae.cli", "serve", "--checkpoint-dir", checkpoint_dir,
               "--port", str(port), "--workers", "1"]
    with tempfile.TemporaryDirectory() as scratch, running(command, port, 1) as pid:
        script = post_script(scratch, drawing_png())
        wrk(port, "/classify", 1, 1.0, pid, script)  # warm-up
        runs = [wrk(port, "/classify", 1, seconds, pid, script) for _ in range(repeats)]
    return {"seconds": seconds, "repeats": repeats,
            **{key: statistics.median(r[key] for r in runs) for key in ("p50_ms", "p99_ms", "rps")}}


def markdown(result: dict, flops: float, gflops: float, tag: str) -> str:
    bound_ms = flops / (gflops * 1e9) * 1e3
    runs, seconds = result["repeats"], result["seconds"]
    return (f"POST /classify of one drawn digit, concurrency 1, one worker, {runs} wrk runs of "
            f"{seconds:.0f} s (medians), machine {tag}: p50 {result['p50_ms']:.1f} ms, "
            f"p99 {result['p99_ms']:.1f} ms. The reading is {flops / 1e9:.3f} GFLOP (XLA's "
            f"count), {bound_ms:.2f} ms at this machine's {gflops:.1f} GFLOP/s GEMM rate: "
            f"p50 is {result['p50_ms'] / bound_ms:.1f} times that bound (the rest is HTTP, the "
            f"upload's preparation and small-matrix kernels). Goal: p50 <= 20 ms.")
