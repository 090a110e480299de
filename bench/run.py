"""`make bench`: training, multi-process, service and data-preparation benchmarks ->
BENCHMARKS.md.

    python -m bench.run [--quick] [--data-dir data] [--checkpoint-dir checkpoints] [--out FILE]
                        [--no-service] [--no-distributed] [--no-startup]

`--quick` is a smoke run (tiny model, synthetic data, ~1 min); its numbers mean nothing.
BENCHMARKS.md opens with the machine (bench/machine.py: CPU, ISA, cores, JAX, a GEMM rate
measured at the start and the end); its ratios come from interleaved rounds (bench/rounds.py).
The service benchmark (bench/bench_service.py) runs against --checkpoint-dir when it holds a
checkpoint, else against the checkpoint the time-to-quality run just wrote.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench import (bench_classify, bench_distributed, bench_prepare, bench_startup,
                   bench_train, hierarchical_step)
from bench.machine import gemm_gflops, measured_machine
from bench.machine import markdown as machine_markdown
from bench.rounds import RATIO_RULE


READING = (
    "How to read this file: the ratios are the claims. Every comparison (A against B) comes "
    "from rounds interleaved in this run, A, B, A, B..., and each ratio is the "
    f"{RATIO_RULE}, so a drift of the machine's speed hits both sides of it alike. Absolute "
    "figures (examples/s, req/s, ms) are this machine's: each table of them names the machine's "
    "tag, and they move by tens of percent on another machine, or on this one within minutes "
    "(compare the GEMM rate at start and end).")


def fmt(value, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def ratio(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def by_batch(table: dict) -> dict:
    """{batch: value} with int keys (JSON turns them into strings)."""
    return {int(k): v for k, v in table.items()}


def training_markdown(r: dict, tag: str) -> str:
    fused, ratios = by_batch(r["fused"]), by_batch(r["ratios"])
    ttq = r["time_to_quality"]
    history = ", ".join(f"epoch {e}: {a:.3f} at {s:.0f} s" for e, s, a in ttq["history"])
    reached = (f"{ttq['seconds']:.0f} s" if ttq["seconds"] is not None
               else f"not reached within {ttq['max_epochs']} epochs")
    torch_note = ", PyTorch" if r["torch_128"] else " (PyTorch: not installed)"
    lines = [
        f"Model: MLP {r['hidden_sizes']}, latent {r['latent_dim']}; "
        f"{r['train_examples']} training examples; device {r['device']}. Ratios: "
        f"{RATIO_RULE}, {r['rounds']} rounds of: fused chunk at each batch, seed loop, a "
        f"{r['matmul_size']}x{r['matmul_size']} matmul{torch_note}.",
        "",
        "| fused chunk | vs seed loop (b16) | vs PyTorch (b128) | of FLOP ideal |",
        "|---|---:|---:|---:|",
    ]
    for batch, q in sorted(ratios.items()):
        lines.append(f"| batch {batch} | {ratio(q['vs_seed_loop_16'])} | "
                     f"{ratio(q['vs_torch_128'])} | {q['of_ideal']:.1%} |")
    lines += ["", f"Absolute figures on `{tag}` (medians over the same rounds):", "",
              "| measurement | examples/s |", "|---|---:|"]
    lines += [f"| fused chunk, batch {batch} | {fmt(rate)} |" for batch, rate in
              sorted(fused.items())]
    lines += [
        f"| baseline (a) seed loop, batch 16 | {fmt(r['seed_loop_16'])} |",
        f"| baseline (b) PyTorch CPU, batch 128 | "
        f"{fmt(r['torch_128']) if r['torch_128'] else 'skipped: torch not installed'} |",
        "",
        f"- Epoch of {r['train_examples']} at batch {r['batch_size']}: "
        f"{r['epoch_seconds']:.1f} s (training only, chunked like the loop).",
        f"- Floor: float32 matmul {r['matmul_gflops']:.1f} GFLOP/s; model "
        f"{r['forward_flops_per_example'] / 1e6:.2f} MFLOP forward, "
        f"{r['train_flops_per_example'] / 1e6:.2f} MFLOP train per example -> FLOP-bound ideal "
        f"{fmt(r['ideal_examples_per_s'])} examples/s.",
        f"- Time to quality (95% conditional sample accuracy, default config, fresh start): "
        f"{reached}. Per epoch: {history}.",
    ]
    return "\n".join(lines)


def shortfalls(r: dict, tag: str) -> str:
    """The issue's targets checked against this run, with the reasons we know of."""
    fused, ratios = by_batch(r["fused"]), by_batch(r["ratios"])
    ideal = r["ideal_examples_per_s"]
    rows = [("training >= 2x the seed loop at batch 16", ratios[16]["vs_seed_loop_16"], 2.0),
            ("training >= 2x PyTorch at batch 128", ratios[128]["vs_torch_128"], 2.0),
            (">= 60% of the FLOP-bound ideal at batch 512", ratios[512]["of_ideal"], 0.6)]
    lines = ["| target | measured | met |", "|---|---:|---|"]
    for name, value, goal in rows:
        met = "n/a" if value is None else ("yes" if value >= goal else "**no**")
        shown = "n/a" if value is None else (f"{value:.0%}" if goal < 1 else f"{value:.2f}x")
        lines.append(f"| {name} | {shown} | {met} |")
    step_ms = 16 / fused[16] * 1000
    seed_ms = 16 / r["seed_loop_16"] * 1000
    matmul_ms = 16 * r["train_flops_per_example"] / (r["matmul_gflops"] * 1e9) * 1000
    lines += ["", REASONS, "", (
        f"- Batch 16 (on `{tag}`): a fused step takes {step_ms:.2f} ms and a seed-loop step "
        f"{seed_ms:.2f} ms. "
        f"Of that, the Adam update of {r['param_count']:,} parameters alone takes "
        f"{r['optimizer_update_ms']:.2f} ms (measured on its own: memory-bound, the same in any "
        f"loop) and the matmuls about {matmul_ms:.2f} ms at the measured rate, so host-side "
        "dispatch, key splitting and copies are a small share of a step and removing them "
        "cannot double throughput. Our step also does work the seed step does not (global "
        "gradient norm and loss terms as per-step metrics, the KL-weight schedule, the batch "
        "gather inside the scan), which eats into what fusing saves. A 2x at batch 16 needs "
        "a cheaper update (e.g. fewer parameters or a fused optimizer), not a different loop.")]
    if r["torch_128"]:
        needed = 2 * r["torch_128"] / ideal
        lines.append(
            f"- Batch 128 against PyTorch (on `{tag}`): 2x PyTorch's {r['torch_128']:,.0f} "
            f"examples/s is {2 * r['torch_128']:,.0f}, {needed:.0%} of the FLOP-bound ideal; "
            f"batch 128 reaches {ratios[128]['of_ideal']:.0%} (its 128-row matmuls run well "
            f"below the large-matrix rate) and even batch 512 only {ratios[512]['of_ideal']:.0%}. "
            "PyTorch's CPU build runs the same matmuls in oneDNN/MKL on the same cores, so what "
            "is left to win is the elementwise work between them; XLA's fusion of it gives our "
            f"{ratios[128]['vs_torch_128']:.2f}x.")
    return "\n".join(lines)


REASONS = """\
- The FLOP-bound ideal counts only the Dense matmuls at the large-matrix GFLOP/s rate. At batch
  512 the per-layer matmuls are small ([512, 794] x [794, 512] and similar), so they run below the
  2048x2048 rate, and the non-matmul work the count ignores (GELU and its derivative, sigmoid
  cross-entropy over 784 pixels, Bernoulli sampling of the binarised batch, the Adam update of
  ~1.1 M parameters, the gather of the batch) is memory-bound elementwise work of the same order
  as the matmuls on a few cores. That is where the gap to the ideal goes.
- PyTorch is optional (`make torch-cpu` installs its CPU build); when it is not installed the
  2x-PyTorch target is not measured.
- Time to quality runs the default config as `make train` does (its warm-up + cosine schedule
  over all its epochs) and stops at the first epoch whose samples reach 95%; if none does, the
  per-epoch accuracies show how close it got.
- Every figure shares the machine's cores with whatever else runs on it, and the machine's speed
  drifts; interleaved rounds make the ratios fair, but the absolute figures stay this machine's
  at this hour (the GEMM rate at the start and end of the run shows by how much it moved)."""


def service_bench(checkpoint_dir: str, quick: bool, tag: str) -> str:
    """Run bench/bench_service.py's main() if that file exists; its stdout is the section."""
    if importlib.util.find_spec("bench.bench_service") is None:
        return "_Skipped: bench/bench_service.py is not present._"
    from bench import bench_service

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench_service.main(["--checkpoint-dir", checkpoint_dir, "--machine-tag", tag]
                                  + (["--quick"] if quick else []))
    return out.getvalue().strip() + ("" if code == 0 else f"\n\n(exit code {code}: errors)")


def export_bench(checkpoint_dir: str, quick: bool, tag: str) -> str:
    """bench/bench_export.py: ONNX Runtime's CPU throughput against the JAX sampler's."""
    from bench import bench_export

    results = bench_export.measure(checkpoint_dir, **(bench_export.QUICK if quick else {}))
    return bench_export.markdown(results, tag)


def has_checkpoint(directory: str) -> bool:
    path = Path(directory)
    return path.is_dir() and any(p.name.isdigit() for p in path.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run with tiny counts")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--checkpoint-dir", default="checkpoints",
                        help="checkpoint for the service benchmark")
    parser.add_argument("--out", default="BENCHMARKS.md")
    parser.add_argument("--json", help="also write the raw training figures as JSON")
    parser.add_argument("--no-service", action="store_true", help="skip the service benchmark")
    parser.add_argument("--no-distributed", action="store_true",
                        help="skip the multi-process training benchmark")
    parser.add_argument("--no-startup", action="store_true",
                        help="skip the start-up benchmark (bench/bench_startup.py)")
    args = parser.parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    machine = measured_machine()
    log(f"machine: {machine.tag}")
    with tempfile.TemporaryDirectory(prefix="cvae-bench-") as workdir:
        results = bench_train.run_all(args.quick, args.data_dir, workdir, log)
        if args.no_service:
            service = "_Skipped: --no-service._"
        else:
            target = args.checkpoint_dir if has_checkpoint(args.checkpoint_dir) else workdir
            log(f"service benchmark against {target}")
            service = service_bench(target, args.quick, machine.tag)
            log(f"/classify benchmark (bench/bench_classify.py) against {target}")
            service += "\n\n### /classify by Bayes' rule\n\n" + bench_classify.markdown(
                bench_classify.measure(target), bench_classify.reading_flops(target),
                machine.gemm_gflops_start, machine.tag)
        target = args.checkpoint_dir if has_checkpoint(args.checkpoint_dir) else workdir
        log(f"export benchmark (bench/bench_export.py) against {target}")
        export = export_bench(target, args.quick, machine.tag)
        if args.no_startup:
            startup = "_Skipped: --no-startup._"
        else:
            log(f"start-up benchmark (bench/bench_startup.py) against {target}, a conv model "
                "and Fashion-MNIST's")
            startup = bench_startup.markdown(bench_startup.measure(
                target, args.data_dir, rounds=1 if args.quick else 3, quick=args.quick),
                machine.tag)
    if args.no_distributed:
        distributed = "_Skipped: --no-distributed._\n"
    else:
        log("multi-process training benchmark (bench/bench_distributed.py)")
        distributed_results = bench_distributed.measure(
            quick=args.quick, **(bench_distributed.QUICK if args.quick else {}))
        results["distributed"] = distributed_results
        distributed = bench_distributed.markdown(distributed_results, machine.tag)
    log("the hierarchical family's step against PyTorch (bench/hierarchical_step.py)")
    results["hierarchical"] = (hierarchical_step.measure(8, (1, 1), 2, rounds=1, steps=1)
                               if args.quick else hierarchical_step.measure())
    hierarchy = hierarchical_step.markdown(results["hierarchical"], machine.tag)
    if args.quick:
        prepare = "_Skipped: --quick (70,000 PNGs take about a minute)._"
    else:
        log("preparing the example data sets (bench/bench_prepare.py)")
        results["prepare"] = bench_prepare.measure()
        prepare = bench_prepare.markdown(results["prepare"], machine.tag)
    machine = dataclasses.replace(machine, gemm_gflops_end=gemm_gflops())
    results["machine"] = {**dataclasses.asdict(machine), "tag": machine.tag}
    header = (f"# Benchmarks\n\nWritten by `python -m bench.run{' --quick' if args.quick else ''}`"
              f" on {time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
              f"{time.perf_counter() - started:.0f} s in all; compile excluded.\n")
    if args.quick:
        header += "\n**Quick mode: tiny model and synthetic data; the numbers are meaningless.**\n"
    text = (header + "\n## Machine\n\n" + machine_markdown(machine) + "\n\n" + READING
            + "\n\n## Training\n\n" + training_markdown(results, machine.tag)
            + "\n\n### The hierarchical family against PyTorch\n\n" + hierarchy
            + "\n\n## Multi-process training\n\n" + distributed + "\n## Service\n\n"
            + service + "\n\n## Start-up\n\n" + startup
            + "\n\n## Export: ONNX Runtime against the JAX sampler\n\n" + export
            + "\n\n## Preparing your own images\n\n" + prepare + "\n")
    text += "\n## Targets, and where we fall short\n\n" + shortfalls(results, machine.tag) + "\n"
    Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
