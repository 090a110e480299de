"""`python -m bench.run --quick` runs end to end as a program and writes its markdown and JSON;
bench/machine.py reads the ISA XLA compiles for from CPU flags and XLA_FLAGS.

The benchmark is run, not imported; the imports from bench/ are machine.py's pure parsing and
service_ab.py's worktree (neither imports JAX). No timing is asserted.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from bench.machine import ISA_LEVELS, UNKNOWN, cpu_isa, describe, effective_isa, xla_max_isa
from bench.service_ab import worktree

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # the benchmark as a program, every part: `make test-slow`
def test_bench_quick_runs_and_writes_markdown(tmp_path):
    out, raw = tmp_path / "BENCHMARKS.md", tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--no-service", "--no-distributed",
         "--no-startup", "--data-dir", str(tmp_path / "no-data"),
         "--checkpoint-dir", str(tmp_path / "none"), "--out", str(out), "--json", str(raw)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    for heading in ("## Machine", "## Training", "### The hierarchical family against PyTorch",
                    "## Multi-process training", "## Service", "## Start-up",
                    "## Export: ONNX Runtime against the JAX sampler",
                    "## Targets, and where we fall short"):
        assert heading in text
    results = json.loads(raw.read_text())
    machine = results["machine"]
    assert machine["gemm_gflops_start"] > 0 and machine["gemm_gflops_end"] > 0
    assert machine["cores"] >= 1
    assert machine["isa"] in (ISA_LEVELS if platform.machine() == "x86_64" else (UNKNOWN,))
    # The tag names the machine beside the training section's absolute figures.
    assert text.index("## Machine") < text.index("## Training")
    assert f"Absolute figures on `{machine['tag']}`" in text
    assert all(results["ratios"][b]["vs_seed_loop_16"] > 0 for b in ("16", "128", "512"))
    assert set(results["fused"]) == {"16", "128", "512"}
    assert results["seed_loop_16"] > 0 and results["ideal_examples_per_s"] > 0
    assert results["time_to_quality"]["history"]
    hierarchy = results["hierarchical"]  # PyTorch's side too where torch is installed
    assert hierarchy["flops"] > 0 and all(t > 0 for t in hierarchy["seconds"]["cvae (JAX)"])
    # The quick run's model is the `test` preset: encoder 794-32-8, decoder 4-32 + 10-32, 32-784;
    # 2 FLOPs per multiply-add of each Dense kernel.
    assert results["forward_flops_per_example"] == 2 * (794 * 32 + 32 * 8 + 4 * 32 + 10 * 32
                                                        + 32 * 784)



# /proc/cpuinfo flag lines: a Zen 3 EPYC (AVX2, no AVX-512), a Sapphire Rapids Xeon, an old Atom.
ZEN3 = "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes"
SAPPHIRE = "sse4_1 sse4_2 avx avx2 avx512f avx512dq avx512_vnni avx512_bf16 amx_tile"
ATOM = "fpu sse sse2 ssse3 sse4_1"


def test_cpu_isa_is_the_best_level_the_flags_name():
    assert cpu_isa(ZEN3) == "AVX2"
    assert cpu_isa(SAPPHIRE) == "AVX512"
    assert cpu_isa("sse4_2 avx") == "AVX"
    assert cpu_isa("sse4_2") == "SSE4_2"
    assert cpu_isa(ATOM) == "below SSE4_2"
    # avx512_vnni alone (without avx512f) is not AVX-512; whole flags only, never substrings.
    assert cpu_isa("sse4_2 avx avx2 avx512_vnni") == "AVX2"


def test_xla_max_isa_caps_what_the_cpu_offers():
    assert xla_max_isa("") is None
    assert xla_max_isa("--xla_force_host_platform_device_count=2") is None
    assert xla_max_isa("--xla_cpu_max_isa=avx --xla_force_host_platform_device_count=2") == "AVX"
    assert xla_max_isa("--xla_cpu_max_isa=AVX2 --xla_cpu_max_isa=SSE4_2") == "SSE4_2"  # last wins
    assert effective_isa("AVX512", "AVX") == "AVX"
    assert effective_isa("AVX2", "AVX512") == "AVX2"  # a cap above the CPU changes nothing
    assert effective_isa("AVX512", "AVX512_VNNI") == "AVX512"
    assert effective_isa("AVX2", None) == "AVX2"


def test_describe_reads_cpuinfo_and_falls_back_where_there_is_none():
    cpuinfo = f"processor\t: 0\nmodel name\t: AMD EPYC 7B13 64-Core Processor\nflags\t\t: {ZEN3}\n"
    machine = describe(cpuinfo, "--xla_cpu_max_isa=SSE4_2", 2, "0.10.2", "cpu")
    assert (machine.cpu_model, machine.cpu_isa, machine.isa, machine.xla_max_isa) == (
        "AMD EPYC 7B13 64-Core Processor", "AVX2", "SSE4_2", "SSE4_2")
    assert machine.tag == "AMD EPYC 7B13, SSE4_2, 2 cores"
    elsewhere = describe("", "", 8, "0.10.2", "cpu", fallback_model="arm64")
    assert (elsewhere.cpu_model, elsewhere.isa) == ("arm64", UNKNOWN)


def test_the_ab_base_is_the_revision_checked_out_and_gone_afterwards(tmp_path):
    """bench/service_ab.py serves `--base` from a detached worktree: the revision's files, not
    the working tree's, and nothing left behind."""
    repository = tmp_path / "repository"
    repository.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repository), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout

    git("init", "--quiet")
    for text in ("as it was\n", "as changed\n"):
        (repository / "service.py").write_text(text)
        git("add", "service.py")
        git("commit", "--quiet", "-m", text)
    (repository / "service.py").write_text("uncommitted\n")
    with worktree("HEAD~1", repository) as tree:
        assert (tree / "service.py").read_text() == "as it was\n"
        assert len(git("worktree", "list").splitlines()) == 2
    assert not tree.exists()
    assert len(git("worktree", "list").splitlines()) == 1
    assert (repository / "service.py").read_text() == "uncommitted\n"
