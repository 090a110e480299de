"""A request's values are the same bits alone or batched (tests/bit_identity.py): on this
CPU's kernels, and in subprocesses that run other kernels on the same machine.

What varies XLA's CPU kernels here (measured with a digest of a dot's output bits, jax
0.10.2 on an AVX-512 EPYC): `--xla_cpu_max_isa=SSE4_2` or `AVX` (other code in and around
YNNPACK's dot), `--xla_cpu_experimental_ynn_fusion_type=` (no YNNPACK: XLA's own dot
emitter), and valgrind, whose emulated CPU reports AVX2 without AVX-512, so YNNPACK picks its
AVX2 kernels as on the machine where these claims first failed. `--xla_cpu_max_isa=AVX2`
changed nothing (YNNPACK picks its kernels from CPUID, not from XLA's flag), nor did the
number of cores (taskset).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bit_identity import check_sampler
from conftest import train_run
from cvae.config import presets
from cvae.sampling.sampler import load_sampler
from cvae.data.synthetic import synthetic_dataset

CHECKER = Path(__file__).with_name("bit_identity.py")
# name -> (command prefix, environment)
KERNEL_VARIANTS = {
    "isa-sse4.2": ((), {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}),
    "no-ynnpack": ((), {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}),
    "valgrind-avx2": (("valgrind", "--tool=none", "-q"), {}),
}


def host_has_avx512() -> bool:
    """Whether this CPU reports AVX-512 (Linux's /proc/cpuinfo; False where it cannot say)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512f" in flags


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory):
    """The test config with every function the sampler runs through blocks: the per-class
    mixture prior (its mapping, and the transport between classes) and, trained with 20
    labels, the classifier q(y|x); 2 epochs of 80 synthetic digits."""
    config = presets.test().replace(prior="mixture", prior_components=2, prior_codes="means",
                                    epochs=2, labels="20", labelled_per_batch=4)
    return train_run(tmp_path_factory.mktemp("mixture-run"), config, synthetic_dataset(80))


@pytest.mark.determinism
@pytest.mark.parametrize("run", ["trained_run", "mixture_run"])
def test_a_request_gets_the_same_bits_alone_or_batched(run, request):
    check_sampler(load_sampler(request.getfixturevalue(run).directory))


@pytest.mark.kernels
@pytest.mark.parametrize("variant", KERNEL_VARIANTS)
def test_the_same_bits_alone_or_batched_under_other_cpu_kernels(variant, mixture_run):
    prefix, environment = KERNEL_VARIANTS[variant]
    if variant == "valgrind-avx2" and not host_has_avx512():
        pytest.skip("this CPU has no AVX-512, so valgrind's AVX2 CPU would run the kernels "
                    "this machine runs: the test suite's own runs check those")
    assert not prefix or shutil.which(prefix[0]), \
        f"{prefix[0]} is not installed (make test-kernels installs it)"
    env = {**os.environ, **environment, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # programs compiled for this CPU's kernels
    result = subprocess.run([*prefix, sys.executable, str(CHECKER), str(mixture_run.directory)],
                            env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.count("\nok ") == 3, result.stdout
    signature = result.stdout.split()[2]
    assert signature != load_sampler(mixture_run.directory).kernel_signature.hex(), \
        f"{variant} ran the same kernels as this process: it tested nothing new"


def test_the_served_fingerprint_names_the_kernels(mixture_run):
    """Replicas on CPUs whose kernels round differently must not share strong ETags."""
    from service.checkpoints import fingerprint

    sampler = load_sampler(mixture_run.directory)
    assert fingerprint(sampler) == fingerprint(load_sampler(mixture_run.directory))
    sampler.drawing_signature = bytes(32)
    assert fingerprint(sampler) != fingerprint(load_sampler(mixture_run.directory))


def test_the_served_fingerprint_names_the_png_encoder(mixture_run, monkeypatch):
    """ISA-L picks its deflate kernels by CPU: replicas whose encoders give other bytes for
    the same pixels must not share strong ETags either."""
    from service import checkpoints

    sampler = load_sampler(mixture_run.directory)
    served = checkpoints.fingerprint(sampler)
    monkeypatch.setattr(checkpoints, "encoder_signature", lambda: b"another encoder")
    assert checkpoints.fingerprint(sampler) != served
