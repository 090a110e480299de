"""ONNX Runtime's CPU throughput on `sample.onnx` against the JAX sampler's, on the same batch.

    python -m bench.bench_export --checkpoint-dir checkpoints           # ~1 min on 2 cores
    python -m bench.bench_export --checkpoint-dir checkpoints --quick   # seconds; smoke only

Both compute `sample(noise, label)` (the prior mapping and the decoder) for the same rows: the
JAX sampler through its fixed blocks, as `/sample` decodes (`Sampler.decode`), and ONNX
Runtime's CPU provider (its default threads, one per core) in one `session.run` of the batch,
on the model `cvae export` writes (converted in memory here; an exported folder's own
sample.onnx when --checkpoint-dir is one). Compilation and session creation are excluded.
Rounds are interleaved (bench/rounds.py); the ratio is ONNX Runtime's rows/s over JAX's, the
median of per-round ratios. `make bench` runs it after the service benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


from bench.rounds import RATIO_RULE, interleaved, median_ratio, timed

BATCHES = (64, 1024)  # the sampler's smallest block, and a page of all ten digits x ~100
QUICK = {"batches": (64,), "rounds": 3, "repeats": 2}


def onnx_model(checkpoint_dir: str, sampler) -> bytes:
    from cvae.export.manifest import is_export

    if is_export(checkpoint_dir):
        return (Path(checkpoint_dir) / "sample.onnx").read_bytes()
    from cvae.export.functions import onnx_functions
    from cvae.export.onnx_files import convert

    portable = next(p for p in onnx_functions(sampler) if p.name == "sample")
    return convert(portable).SerializeToString()


def measure(checkpoint_dir: str, batches=BATCHES, rounds: int = 7, repeats: int = 10) -> dict:
    """rows/s of each side at each batch size (medians over rounds) and their ratio."""
    from cvae.export.load import open_sampler
    from cvae.export.onnx_files import session
    from cvae.sampling.latents import request_latents

    sampler = open_sampler(checkpoint_dir)
    onnx = session(onnx_model(checkpoint_dir, sampler))
    results = {"step": sampler.step, "latent_dim": sampler.code_dim,
               "hidden_sizes": list(sampler.config.model.options.hidden_sizes),
               "prior": sampler.config.prior.name,
               "rounds": rounds, "batches": {}}
    for batch in batches:
        noise, labels = request_latents(0, sampler.classes, -(-batch // len(sampler.classes)),
                                        noise_width=sampler.noise_dim, temperature=1.0)
        noise, labels = noise[:batch], labels[:batch]
        feeds = {"noise": noise, "label": labels}
        sampler.decode(noise, labels), onnx.run(None, feeds)  # warm up

        def jax_side():
            for _ in range(repeats):
                sampler.decode(noise, labels)

        def onnx_side():
            for _ in range(repeats):
                onnx.run(None, feeds)

        seconds = interleaved({"jax": timed(jax_side), "onnx": timed(onnx_side)}, rounds)
        rates = {side: [batch * repeats / s for s in times] for side, times in seconds.items()}
        results["batches"][batch] = {
            "jax_rows_per_s": statistics.median(rates["jax"]),
            "onnx_rows_per_s": statistics.median(rates["onnx"]),
            "onnx_over_jax": median_ratio(rates["onnx"], rates["jax"])}
    return results


def markdown(results: dict, tag: str) -> str:
    lines = [f"`sample(noise, label)` of the model at step {results['step']} (MLP "
             f"{results['hidden_sizes']}, latent {results['latent_dim']}, {results['prior']} "
             f"prior): ONNX Runtime CPU (`sample.onnx`, one run per batch) against the JAX "
             f"sampler (its fixed blocks, as /sample). Ratio: {RATIO_RULE}, "
             f"{results['rounds']} rounds.", "",
             "| batch | ONNX Runtime / JAX | ONNX Runtime rows/s | JAX rows/s |",
             "|---:|---:|---:|---:|"]
    for batch, row in sorted(results["batches"].items(), key=lambda item: int(item[0])):
        lines.append(f"| {batch} | {row['onnx_over_jax']:.2f}x | {row['onnx_rows_per_s']:,.0f} "
                     f"| {row['jax_rows_per_s']:,.0f} |")
    lines += ["", f"Absolute figures on `{tag}`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints",
                        help="a checkpoint directory or an exported folder")
    parser.add_argument("--quick", action="store_true", help="one batch size, 3 rounds")
    parser.add_argument("--machine-tag", default="this machine")
    args = parser.parse_args(argv)
    results = measure(args.checkpoint_dir, **(QUICK if args.quick else {}))
    print(markdown(results, args.machine_tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
