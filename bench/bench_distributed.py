"""Training throughput as 2 processes x 1 core, 1 process x 2 host devices and the plain default.

    python -m bench.bench_distributed [--quick] [--rounds 3] [--json FILE]

Each configuration runs in its own processes (the device count is fixed when JAX starts), the
default model and batch on random uint8 pixels (speed does not depend on their values), timed
over fused chunks exactly as the loop runs them, compile excluded. The three configurations
alternate for `--rounds` interleaved rounds (bench/rounds.py); each figure is the median of its
rounds and each ratio the median of its per-round ratios, so drift on a shared machine hits
both sides of a ratio alike. The 2 processes are pinned to one core each and talk through
JAX's distributed runtime (gloo over loopback); 1 process x 2 devices shares both cores.
Also reported: the bytes all-reduced per step, read from the compiled 2-device program, and a
paper projection of data parallelism to 8 GPUs from those bytes, a measured step time and a
stated interconnect bandwidth.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

from bench.machine import measured_machine
from bench.rounds import RATIO_RULE, interleaved, median_ratio

# Stated bandwidths for the projection (per GPU, one direction, what NCCL's ring reaches on
# large messages, not the link's peak): PCIe 4.0 x16 and NVLink 4 (H100 SXM, NVSwitch).
INTERCONNECTS = {"PCIe 4.0 x16": 20e9, "NVLink 4 (H100 SXM)": 350e9}
# Per-hop latency of a ring all-reduce step (a stated assumption, typical of NCCL).
HOP_LATENCY_S = 10e-6
PROJECTED_DEVICES = 8
QUICK = {"rounds": 1, "steps": 50, "repeats": 1}  # --quick: a smoke run, numbers mean nothing


def worker(args) -> None:
    """One process of one configuration; process 0 prints the result as a JSON line."""
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # before JAX sizes its thread pools
    from cvae.training import processes
    processes.initialize(args.coordinator_address, args.num_processes, args.process_id)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from cvae.config import presets
    from cvae.model.registry import create_model
    from cvae.training.optimizer import create_optimizer
    from cvae.training.devices import all_reduce_bytes, create_mesh, replicate
    from cvae.training.step import create_train_chunk, create_train_step, epoch_permutation
    from cvae.training.supervision import FullLabels

    config = presets.default()
    if args.quick:
        config = config.replace(hidden_sizes=(64,), latent_dim=4)
    batch = config.run.batch_size
    chunks = max(1, args.steps // config.run.steps_per_call)
    rows = np.random.default_rng(0).integers(0, 256,
                                             (chunks * config.run.steps_per_call * batch, 784),
                                             dtype=np.uint8)
    mesh = create_mesh()
    key = jax.random.key(config.run.seed)
    optimizer, _ = create_optimizer(config, 100 * chunks * config.run.steps_per_call)
    state, train_step = create_train_step(create_model(config), optimizer, config, key=key,
                                          supervision=FullLabels(config), mesh=mesh)
    chunk = create_train_chunk(train_step, batch, mesh, max_steps=config.run.steps_per_call)
    images, labels = replicate((jnp.asarray(rows), jnp.asarray(rows[:, 0] % 10, jnp.int32)), mesh)
    order = replicate(epoch_permutation(key, 0, rows.shape[0]), mesh)
    result = {"devices": mesh.size, "processes": jax.process_count(), "batch_size": batch,
              "parameters": int(sum(x.size for x in jax.tree.leaves(state.params)))}
    if mesh.size > 1:
        lowered = chunk.jitted.lower(state, images, labels, order, 0, key, num_steps=1)
        result["all_reduce_bytes"], result["all_reduce_ops"] = all_reduce_bytes(
            lowered.compile().as_text())

    def run_epoch(state):
        for i in range(chunks):
            state, metrics = chunk(state, images, labels, order, i * config.run.steps_per_call, key,
                                   num_steps=config.run.steps_per_call)
        jax.block_until_ready(metrics)
        return state

    if mesh.size > 1:
        result.update(all_reduce_ms(state.params, mesh))
    state = run_epoch(state)  # compile
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        state = run_epoch(state)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    result["examples_per_s"] = chunks * config.run.steps_per_call * batch / seconds
    result["step_ms"] = 1000 * seconds / (chunks * config.run.steps_per_call)
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(result), flush=True)


def all_reduce_ms(params, mesh, repeats: int = 20) -> dict[str, float]:
    """Milliseconds to all-reduce gradient-shaped buffers: one per parameter array, as the step
    does (XLA fuses them into one tuple all-reduce, which the CPU backend's collectives still
    run buffer by buffer), and the same bytes as one flat buffer."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from cvae.training.devices import DATA_AXIS

    split = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    replicated = NamedSharding(mesh, PartitionSpec())
    local = mesh.size // jax.process_count()

    def partial_sums(shapes):  # one row per device, summed over devices = an all-reduce
        return [jax.make_array_from_process_local_data(
            split, np.ones((local, *shape), np.float32), (mesh.size, *shape)) for shape in shapes]

    shapes = [x.shape for x in jax.tree.leaves(params)]
    total = sum(int(np.prod(shape)) for shape in shapes)
    reduce = jax.jit(lambda xs: [jnp.sum(x, axis=0) for x in xs], out_shardings=replicated)
    timings = {}
    for name, buffers in (("all_reduce_ms_per_array", partial_sums(shapes)),
                          ("all_reduce_ms_flat", partial_sums([(total,)]))):
        jax.block_until_ready(reduce(buffers))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(reduce(buffers))
            times.append(time.perf_counter() - start)
        timings[name] = 1000 * statistics.median(times)
    timings["gradient_arrays"] = len(shapes)
    return timings


CONFIGURATIONS = {
    "default": {"processes": 1, "devices": 1},
    "1 process x 2 host devices": {"processes": 1, "devices": 2},
    "2 processes x 1 core": {"processes": 2, "devices": 1},
}


def run_configuration(name: str, steps: int, repeats: int, quick: bool) -> dict:
    from cvae.training.launch import free_port

    spec = CONFIGURATIONS[name]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if spec["devices"] > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={spec['devices']}"
    base = [sys.executable, "-m", "bench.bench_distributed", "--worker", "--steps", str(steps),
            "--repeats", str(repeats), *(["--quick"] if quick else [])]
    if spec["processes"] == 1:
        commands = [base + ["--num-processes", "1"]]
    else:
        address = f"127.0.0.1:{free_port()}"
        cores = sorted(os.sched_getaffinity(0))
        commands = [base + ["--coordinator-address", address, "--num-processes",
                            str(spec["processes"]), "--process-id", str(i),
                            *(["--cpu", str(cores[i])] if len(cores) > i else [])]
                    for i in range(spec["processes"])]
    processes = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for c in commands]
    try:
        outputs = [p.communicate(timeout=900) for p in processes]
    finally:
        for p in processes:
            p.kill()
            p.wait()
    for p, (_, err) in zip(processes, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"{name}: exit {p.returncode}: {err[-2000:]}")
    line = next(t for t in outputs[0][0].splitlines() if t.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def projection(step_ms: float, batch: int, all_reduce: int) -> list[dict]:
    """8 data-parallel devices on paper: per-device batch `batch`, measured compute per step."""
    rows = []
    n = PROJECTED_DEVICES
    for name, bandwidth in INTERCONNECTS.items():
        # Ring all-reduce: each device sends and receives 2 (n - 1) / n of the buffer.
        comm_ms = 1000 * (2 * (n - 1) / n * all_reduce / bandwidth + 2 * (n - 1) * HOP_LATENCY_S)
        total = step_ms + comm_ms
        rows.append({"interconnect": name, "bandwidth_gb_s": bandwidth / 1e9,
                     "comm_ms": comm_ms, "step_ms": total,
                     "examples_per_s": n * batch / (total / 1000),
                     "efficiency": step_ms / total})
    return rows


def measure(rounds: int = 3, steps: int = 200, repeats: int = 3, quick: bool = False) -> dict:
    results = interleaved({name: functools.partial(run_configuration, name, steps, repeats, quick)
                           for name in CONFIGURATIONS}, rounds)
    default_rounds = [r["examples_per_s"] for r in results["default"]]
    summary = {"rounds": rounds, "steps": steps, "repeats": repeats, "quick": quick,
               "cores": len(os.sched_getaffinity(0)), "configurations": {}}
    for name, runs in results.items():
        summary["configurations"][name] = {
            **runs[0], "examples_per_s": statistics.median(r["examples_per_s"] for r in runs),
            "step_ms": statistics.median(r["step_ms"] for r in runs),
            "vs_default": median_ratio([r["examples_per_s"] for r in runs], default_rounds),
            "examples_per_s_rounds": [round(r["examples_per_s"]) for r in runs]}
    two = summary["configurations"]["1 process x 2 host devices"]
    default = summary["configurations"]["default"]
    summary["projection"] = projection(default["step_ms"], default["batch_size"],
                                       two["all_reduce_bytes"])
    return summary


def markdown(r: dict, tag: str) -> str:
    configurations = r["configurations"]
    default = configurations["default"]
    lines = [
        f"{'Quick (tiny)' if r['quick'] else 'Default'} model ({default['parameters']:,} "
        f"parameters), batch {default['batch_size']} "
        f"(global), {r['steps']} steps per timing, median of {r['repeats']} timings per round, "
        f"{r['rounds']} interleaved rounds; {r['cores']} cores. Ratios: {RATIO_RULE}.",
        "",
        "| configuration | vs default |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {c['vs_default']:.2f}x |" for name, c in configurations.items()]
    lines += ["", f"Absolute figures on `{tag}`:", "",
              "| configuration | examples/s | step ms | examples/s per round |",
              "|---|---:|---:|---|"]
    for name, c in configurations.items():
        lines.append(f"| {name} | {c['examples_per_s']:,.0f} | {c['step_ms']:.2f} | "
                     f"{', '.join(f'{v:,}' for v in c['examples_per_s_rounds'])} |")
    two = configurations["1 process x 2 host devices"]
    gloo = configurations["2 processes x 1 core"]
    lines += [
        "",
        f"All-reduced per step (compiled 2-device program): {two['all_reduce_bytes']:,} bytes in "
        f"{two['all_reduce_ops']} all-reduce op(s): the float32 gradients of "
        f"{two['parameters']:,} parameters ({4 * two['parameters']:,} bytes) plus the loss "
        f"terms, fused by XLA into one collective.",
        "",
        "| all-reduce of the gradient bytes | 1 process x 2 devices | 2 processes (gloo) |",
        "|---|---:|---:|",
        f"| as the step does it ({two['gradient_arrays']} arrays) | "
        f"{two['all_reduce_ms_per_array']:.2f} ms | {gloo['all_reduce_ms_per_array']:.2f} ms |",
        f"| one flat buffer | {two['all_reduce_ms_flat']:.2f} ms | "
        f"{gloo['all_reduce_ms_flat']:.2f} ms |",
        "",
        f"Paper projection to {PROJECTED_DEVICES} GPUs, data parallel, batch "
        f"{default['batch_size']} per GPU (global {PROJECTED_DEVICES * default['batch_size']}), "
        f"compute per step = the measured default step ({default['step_ms']:.2f} ms), ring "
        f"all-reduce of those bytes at the stated bandwidth plus {HOP_LATENCY_S * 1e6:.0f} us "
        f"per hop:",
        "",
        "| interconnect (stated bandwidth) | all-reduce ms | step ms | examples/s | efficiency "
        "| compute step for 90% |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in r["projection"]:
        lines.append(f"| {p['interconnect']} ({p['bandwidth_gb_s']:.0f} GB/s) | "
                     f"{p['comm_ms']:.3f} | {p['step_ms']:.2f} | {p['examples_per_s']:,.0f} | "
                     f"{p['efficiency']:.1%} | >= {9 * p['comm_ms']:.2f} ms |")
    lines += [
        "",
        "Efficiency = compute / (compute + all-reduce), nothing overlapped. A GPU computes this "
        "small model's step far faster than this CPU (not measured: no GPU here), so the "
        "last column says how long a step must be for the all-reduce to cost at most 10%.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; numbers mean nothing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="steps per timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings per round")
    parser.add_argument("--json", help="also write the raw figures as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator-address", help=argparse.SUPPRESS)
    parser.add_argument("--num-processes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    counts = QUICK if args.quick else {"rounds": args.rounds, "steps": args.steps,
                                       "repeats": args.repeats}
    machine = measured_machine()
    results = measure(quick=args.quick, **counts)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(markdown(results, machine.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
