"""`python -m bench.run --quick` runs end to end as a program and writes its markdown and JSON.

The benchmark is run, not imported: tests stand alone from bench/. No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_quick_runs_and_writes_markdown(tmp_path):
    out, raw = tmp_path / "BENCHMARKS.md", tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--no-service", "--no-distributed",
         "--data-dir", str(tmp_path / "no-data"), "--out", str(out), "--json", str(raw)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    for heading in ("## Training", "## Multi-process training", "## Service",
                    "## Targets, and where we fall short"):
        assert heading in text
    results = json.loads(raw.read_text())
    assert set(results["fused"]) == {"16", "128", "512"}
    assert results["seed_loop_16"] > 0 and results["ideal_examples_per_s"] > 0
    assert results["time_to_quality"]["history"]
    # The quick run's model is the `test` preset: encoder 794-32-8, decoder 4-32 + 10-32, 32-784;
    # 2 FLOPs per multiply-add of each Dense kernel.
    assert results["forward_flops_per_example"] == 2 * (794 * 32 + 32 * 8 + 4 * 32 + 10 * 32
                                                        + 32 * 784)

