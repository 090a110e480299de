"""The hierarchical family's training step on the CPU: cvae's (JAX) against the same network in
PyTorch (channels-last convolutions, the `torch` extra or `make torch-cpu`), and against its
FLOP bound at this machine's matrix rate.

    python -m bench.hierarchical_step [--width 32] [--depths 1,2,2] [--latent-channels 4]
                                      [--rounds 5] [--steps 3]

One Adam step at batch 128 of 28x28 binary images (Bernoulli), the negative ELBO with every
group's KL in closed form and the code's against N(0, I). Each round times `--steps` steps of
each side, interleaved (`bench.rounds`): cvae's in one `lax.scan` call, as its training loop
runs them (`--steps-per-call`), PyTorch's one after another. The times are medians of the
rounds, the ratio the median of the per-round ratios. The FLOPs are XLA's count of one
compiled JAX step; the bound is that count at the machine's matrix rate
(`bench.machine.gemm_gflops`).
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.machine import gemm_gflops
from bench.rounds import RATIO_RULE, interleaved, median_ratio, timed
from cvae.config import presets
from cvae.model import hierarchical
from cvae.model.registry import create_model, init_variables

BATCH, SIDE, CLASSES = 128, 28, 10


def jax_step(config, images: np.ndarray, labels: np.ndarray):
    """(chunk, inputs, XLA's FLOPs of one step): `chunk(params, opt_state, images, keys)` runs
    one Adam step per key in a `lax.scan`, jitted, -> (params, opt_state)."""
    model = create_model(config)
    variables = init_variables(model, jax.random.key(0))
    optimizer = optax.adam(1e-3)

    def loss(params, x, key):
        noise = jax.random.normal(key, (1, BATCH, model.noise_dim))
        terms = model.apply({**variables, "params": params}, x, jnp.asarray(labels), noise,
                            method="terms")
        return (terms.kl_dims.sum(-1) + terms.kl_rest - terms.log_px).mean()

    def step(params, state, x, key):
        grads = jax.grad(loss)(params, x, key)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    @jax.jit
    def chunk(params, state, x, keys):
        return jax.lax.scan(lambda carry, key: (step(*carry, x, key), None),
                            (params, state), keys)[0]

    params = variables["params"]
    inputs = (params, optimizer.init(params), jnp.asarray(images))
    flops = jax.jit(step).lower(*inputs, jax.random.key(1)).compile().cost_analysis()["flops"]
    return chunk, inputs, flops


def torch_step(options, images: np.ndarray, labels: np.ndarray):
    """The same network and loss in PyTorch: () -> one Adam step, warmed."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    gelu = nn.GELU(approximate="tanh")  # flax's gelu is the tanh approximation
    width, depths, latent = options.width, options.depths, options.latent_channels
    levels = len(hierarchical.resolutions(options, SIDE, SIDE))
    bound = hierarchical.LOGVAR_BOUND

    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            mid = max(width // 4, 8)
            self.label = nn.Linear(CLASSES, width, bias=False)
            self.convs = nn.ModuleList([
                nn.Conv2d(width, mid, 1), nn.Conv2d(mid, mid, 3, padding=1),
                nn.Conv2d(mid, mid, 3, padding=1), nn.Conv2d(mid, width, 1)])

        def forward(self, h, onehot):
            x = h + self.label(onehot)[:, :, None, None]
            for conv in self.convs:
                x = conv(gelu(x))
            return h + x

    class Network(nn.Module):
        def __init__(self):
            super().__init__()
            groups = sum(depths[1:levels])
            self.stem = nn.Conv2d(1, width, 1)
            self.encoder = nn.ModuleList([Cell() for level in range(levels)
                                          for _ in range(depths[level])])
            self.code = nn.Conv2d(width, 2 * latent, 1)
            coarsest = SIDE // 2 ** (levels - 1)
            self.start = nn.Parameter(0.02 * torch.randn(1, width, coarsest, coarsest))
            self.decoder = nn.ModuleList([Cell() for level in reversed(range(levels))
                                          for _ in range(depths[level])])
            self.priors = nn.ModuleList([nn.Conv2d(width, 2 * latent + width, 1)
                                         for _ in range(groups - 1)])
            self.posteriors = nn.ModuleList([nn.Conv2d(2 * width, 2 * latent, 1)
                                             for _ in range(groups - 1)])
            self.injections = nn.ModuleList([nn.Conv2d(latent, width, 1) for _ in range(groups)])
            self.head = nn.Conv2d(width, 1, 1)

        def forward(self, x, onehot):
            h, maps, cells = self.stem(x), [], iter(self.encoder)
            for level in range(levels):
                h = F.avg_pool2d(h, 2) if level else h
                for _ in range(depths[level]):
                    h = next(cells)(h, onehot)
                maps.append(h)
            h = self.start.expand(x.shape[0], -1, -1, -1)
            kl, index, cells = 0.0, 0, iter(self.decoder)
            for level in reversed(range(levels)):
                h = F.interpolate(h, scale_factor=2, mode="nearest") if level < levels - 1 else h
                for _ in range(depths[level]):
                    if level > 0:
                        if index == 0:
                            q_mean, q_logvar = self.code(maps[level]).chunk(2, 1)
                            p_mean = p_logvar = torch.zeros_like(q_mean)
                        else:
                            p_mean, p_logvar, added = self.priors[index - 1](h).split(
                                [latent, latent, width], 1)
                            h = h + added
                            q_mean, q_logvar = self.posteriors[index - 1](
                                torch.cat([h, maps[level]], 1)).chunk(2, 1)
                        q_logvar = bound * torch.tanh(q_logvar / bound)
                        p_logvar = bound * torch.tanh(p_logvar / bound)
                        z = q_mean + torch.exp(0.5 * q_logvar) * torch.randn_like(q_mean)
                        kl = kl + 0.5 * (p_logvar - q_logvar - 1 + (
                            q_logvar.exp() + (q_mean - p_mean) ** 2) * (-p_logvar).exp()
                        ).sum((1, 2, 3))
                        h = h + self.injections[index](z)
                        index += 1
                    h = next(cells)(h, onehot)
            logits = self.head(gelu(h))
            rec = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum((1, 2, 3))
            return (rec + kl).mean()

    torch.manual_seed(0)
    network = Network().to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    x = torch.from_numpy(images.reshape(BATCH, 1, SIDE, SIDE)).contiguous(
        memory_format=torch.channels_last)
    onehot = F.one_hot(torch.from_numpy(labels.astype(np.int64)), CLASSES).float()

    def step():
        optimizer.zero_grad(set_to_none=True)
        network(x, onehot).backward()
        optimizer.step()

    step()
    return step


def measure(width: int = 32, depths: tuple[int, ...] = (1, 2, 2), latent_channels: int = 4, *,
            rounds: int = 5, steps: int = 3) -> dict:
    """Seconds a step of each side, each interleaved round (PyTorch's left out when torch is
    missing), XLA's FLOPs of a step and the matrix rate."""
    config = presets.default().replace(model="hierarchical", width=width, depths=depths,
                                       latent_channels=latent_channels, prior="standard")
    rng = np.random.default_rng(0)
    images = (rng.random((BATCH, SIDE * SIDE)) < 0.2).astype(np.float32)
    labels = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    chunk, (params, opt_state, x), flops = jax_step(config, images, labels)
    keys = jax.random.split(jax.random.key(1), steps)
    state = jax.block_until_ready(chunk(params, opt_state, x, keys))

    def ours():
        nonlocal state
        state = jax.block_until_ready(chunk(*state, x, keys))

    sides = {"cvae (JAX)": ours}
    try:
        theirs = torch_step(config.model.options, images, labels)
        sides["PyTorch"] = lambda: [theirs() for _ in range(steps)]
    except ImportError:
        pass
    times = interleaved({name: timed(run) for name, run in sides.items()}, rounds)
    return {"width": width, "depths": depths, "latent_channels": latent_channels,
            "flops": flops, "gflops": gemm_gflops(),
            "seconds": {name: [t / steps for t in values] for name, values in times.items()}}


def markdown(results: dict, tag: str) -> str:
    bound = results["flops"] / (results["gflops"] * 1e9)
    seconds = results["seconds"]
    lines = [f"One Adam step of `--model hierarchical --width {results['width']} --depths "
             f"{','.join(map(str, results['depths']))} --latent-channels "
             f"{results['latent_channels']}` at batch {BATCH} ({tag}): "
             f"{results['flops'] / 1e9:.2f} GFLOP by XLA's count, so {1e3 * bound:.0f} ms at "
             f"this machine's {results['gflops']:.0f} GFLOP/s. PyTorch runs the same network "
             "with channels-last convolutions; cvae's steps run in one `lax.scan` call, as it "
             "trains (`python -m bench.hierarchical_step`).", "",
             "| side | ms a step (median) | images/s | share of the bound | rounds (ms) |",
             "|---|---:|---:|---:|---|"]
    for name, values in seconds.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {1e3 * median:.0f} | {BATCH / median:.0f} | "
                     f"{100 * bound / median:.0f}% | "
                     f"{', '.join(f'{1e3 * v:.0f}' for v in values)} |")
    if "PyTorch" in seconds:
        ratio = median_ratio(seconds["cvae (JAX)"], seconds["PyTorch"])
        lines += ["", f"cvae's step takes {ratio:.2f}x PyTorch's ({RATIO_RULE})."]
    else:
        lines += ["", "_PyTorch not installed (`make torch-cpu`): cvae's side only._"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depths", default="1,2,2")
    parser.add_argument("--latent-channels", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    results = measure(args.width, tuple(int(d) for d in args.depths.split(",")),
                      args.latent_channels, rounds=args.rounds, steps=args.steps)
    print(markdown(results, "this machine"))


if __name__ == "__main__":
    main()
