"""The machine a benchmark ran on: CPU, the ISA XLA's CPU backend compiles for, cores, JAX, GEMM.

    machine = describe(read_cpuinfo(), os.environ.get("XLA_FLAGS", ""), cores(), ...)
    machine = this_machine()            # the same, from this process's environment
    machine.tag                         # 'AMD EPYC, AVX512, 2 cores, 95 GFLOP/s': beside figures

Absolute figures (examples/s, req/s, ms) are this machine's and move by tens of percent between
machines, and within minutes on a shared one; the GEMM rate, measured at the start and at the end
of a run, shows how fast the machine was while it ran. Everything but `gemm_gflops` is pure and
imports no JAX.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import statistics
import time

# XLA's spellings (its --xla_cpu_max_isa values), oldest first; a CPU flag from /proc/cpuinfo
# names each. XLA's finer AVX512_* / AMX levels count here as AVX512.
ISA_LEVELS = ("SSE4_2", "AVX", "AVX2", "AVX512")
ISA_CPU_FLAGS = {"SSE4_2": "sse4_2", "AVX": "avx", "AVX2": "avx2", "AVX512": "avx512f"}
BELOW_KNOWN = "below SSE4_2"
UNKNOWN = "unknown"  # no x86 flags line (another architecture, or no /proc/cpuinfo)
GEMM_SIZE = 1024
GEMM_REPEATS = 20


@dataclasses.dataclass(frozen=True)
class Machine:
    cpu_model: str
    isa: str  # the best level XLA may use: the CPU's, capped by --xla_cpu_max_isa
    cpu_isa: str  # the best level the CPU flags name
    xla_max_isa: str | None  # --xla_cpu_max_isa from XLA_FLAGS, if set
    cores: int  # usable by this process (its affinity mask)
    jax_version: str
    backend: str
    gemm_gflops_start: float | None = None  # float32 GEMM_SIZE^2 matmul, median of repeats
    gemm_gflops_end: float | None = None

    @property
    def tag(self) -> str:
        gemm = "" if self.gemm_gflops_start is None else f", {self.gemm_gflops_start:.0f} GFLOP/s"
        return f"{short_cpu_name(self.cpu_model)}, {self.isa}, {self.cores} cores{gemm}"


def cpu_isa(flags: str | None) -> str:
    """The best of ISA_LEVELS that a /proc/cpuinfo `flags` line names (BELOW_KNOWN if none,
    UNKNOWN without a flags line)."""
    if flags is None:
        return UNKNOWN
    present = set(flags.lower().split())
    found = [level for level in ISA_LEVELS if ISA_CPU_FLAGS[level] in present]
    return found[-1] if found else BELOW_KNOWN


def xla_max_isa(xla_flags: str) -> str | None:
    """The value of --xla_cpu_max_isa in an XLA_FLAGS string (upper-cased), or None."""
    found = re.findall(r"--xla_cpu_max_isa=(\S+)", xla_flags)
    return found[-1].upper() if found else None  # XLA keeps the last occurrence


def effective_isa(cpu_level: str, cap: str | None) -> str:
    """What XLA compiles for: the CPU's level, lowered to the cap when one is set."""
    if cap is None or cpu_level not in ISA_LEVELS:
        return cpu_level
    cap_level = "AVX512" if cap.startswith(("AVX512", "AMX")) else cap
    if cap_level not in ISA_LEVELS:
        return cpu_level
    return ISA_LEVELS[min(ISA_LEVELS.index(cpu_level), ISA_LEVELS.index(cap_level))]


def cpuinfo_field(cpuinfo: str, name: str) -> str | None:
    """The first `name : value` field of /proc/cpuinfo text."""
    match = re.search(rf"^{re.escape(name)}\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else None


def short_cpu_name(model: str) -> str:
    """'Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz' -> 'Intel Xeon Platinum 8375C'."""
    name = re.sub(r"\((R|TM|tm)\)|\bCPU\b|@.*$|\b\d+-Core Processor\b|\bProcessor\b", "", model)
    return " ".join(name.split()) or model


def describe(cpuinfo: str, xla_flags: str, cores: int, jax_version: str, backend: str,
             fallback_model: str = "") -> Machine:
    """The machine from /proc/cpuinfo text (empty where there is none) and the environment."""
    level = cpu_isa(cpuinfo_field(cpuinfo, "flags"))
    cap = xla_max_isa(xla_flags)
    model = (cpuinfo_field(cpuinfo, "model name") or cpuinfo_field(cpuinfo, "Model")
             or fallback_model or "unknown CPU")
    return Machine(model, effective_isa(level, cap), level, cap, cores, jax_version, backend)


def read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:  # not Linux: describe() falls back to `platform`
        return ""


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def this_machine() -> Machine:
    """describe() of this process's machine, without the GEMM rates."""
    import jax

    return describe(read_cpuinfo(), os.environ.get("XLA_FLAGS", ""), usable_cores(),
                    jax.__version__, jax.default_backend(),
                    platform.processor() or platform.machine())


def gemm_call(size: int = GEMM_SIZE):
    """A compiled float32 size x size matmul, as a call that waits for its result; and the
    FLOPs of one call."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()  # compile
    return (lambda: dot(a, b).block_until_ready()), 2.0 * size**3


def gemm_gflops(size: int = GEMM_SIZE, repeats: int = GEMM_REPEATS) -> float:
    """Median GFLOP/s of a jitted float32 size x size matmul (compile excluded)."""
    call, flops = gemm_call(size)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return flops / statistics.median(times) / 1e9


def measured_machine() -> Machine:
    """this_machine() with the GEMM rate measured now as its start rate."""
    return dataclasses.replace(this_machine(), gemm_gflops_start=gemm_gflops())


def markdown(machine: Machine) -> str:
    """BENCHMARKS.md's Machine block."""
    cap = (f"capped by `--xla_cpu_max_isa={machine.xla_max_isa}`" if machine.xla_max_isa
           else "no `--xla_cpu_max_isa` in XLA_FLAGS")
    drift = ""
    if machine.gemm_gflops_start and machine.gemm_gflops_end:
        drift = f" ({machine.gemm_gflops_end / machine.gemm_gflops_start - 1:+.0%})"
    end = "n/a" if machine.gemm_gflops_end is None else f"{machine.gemm_gflops_end:.1f}"
    start = "n/a" if machine.gemm_gflops_start is None else f"{machine.gemm_gflops_start:.1f}"
    return "\n".join([
        f"Tag: `{machine.tag}` (beside every table of absolute figures below).", "",
        "| | |", "|---|---|",
        f"| CPU | {machine.cpu_model} |",
        f"| ISA XLA compiles for | {machine.isa} (CPU: {machine.cpu_isa}; {cap}) |",
        f"| cores usable | {machine.cores} |",
        f"| JAX | {machine.jax_version}, backend {machine.backend} |",
        f"| GEMM float32 {GEMM_SIZE}x{GEMM_SIZE}, GFLOP/s (median of {GEMM_REPEATS}) | "
        f"start {start}, end {end}{drift} |",
    ])
