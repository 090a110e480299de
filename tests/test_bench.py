"""`python -m bench.run --quick` runs end to end and writes its markdown (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from bench import run


@pytest.mark.slow
def test_bench_quick_runs_and_writes_markdown(tmp_path):
    out, raw = tmp_path / "BENCHMARKS.md", tmp_path / "bench.json"
    code = run.main(["--quick", "--no-service", "--data-dir", str(tmp_path / "no-data"),
                     "--out", str(out), "--json", str(raw)])
    assert code == 0
    text = out.read_text()
    for heading in ("## Training", "## Service", "## Targets, and where we fall short"):
        assert heading in text
    results = json.loads(raw.read_text())
    assert set(results["fused"]) == {"16", "128", "512"}
    assert results["seed_loop_16"] > 0 and results["ideal_examples_per_s"] > 0
    assert results["time_to_quality"]["history"]


def test_flops_count_matches_dense_shapes():
    import jax

    from bench.bench_train import forward_flops_per_example
    from cvae import config as config_lib
    from cvae.model import create_model, init_variables

    config = config_lib.test()  # encoder 794-32-8, decoder 4-32 + 10-32, 32-784
    params = init_variables(create_model(config), jax.random.key(0))["params"]
    expected = 2 * (794 * 32 + 32 * 8 + 4 * 32 + 10 * 32 + 32 * 784)
    assert forward_flops_per_example(params) == expected
