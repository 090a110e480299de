"""A family registered by a test alone goes through every stage: train, resume, the service's
/sample, `cvae eval` and `cvae export` (tests/toy_family.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvae import presets
from cvae.data.synthetic import synthetic_dataset
from cvae.model import registry
from cvae.training.callbacks import Checkpointer
from cvae.training.checkpoints import load_checkpoint
from cvae.training.loop import train_and_evaluate


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "toy", "toy_family")
    return presets.test().replace(model="toy", prior="mixture", epochs=2)


def _params(directory):
    return jax.tree.leaves(load_checkpoint(directory).state.params)


def test_a_test_only_family_trains_resumes_serves_evaluates_and_exports(toy, data_dir, tmp_path):
    from cvae.evaluation.run import EvalOptions, run_eval
    from cvae.export.manifest import verify_folder
    from service.app import create_app

    data = synthetic_dataset(80)
    whole, parted = tmp_path / "whole", tmp_path / "parted"
    train_and_evaluate(toy, data, whole, callbacks=[Checkpointer()])
    train_and_evaluate(toy.replace(max_steps=4), data, parted, callbacks=[Checkpointer()])
    train_and_evaluate(toy, data, parted, callbacks=[Checkpointer()])
    assert load_checkpoint(parted).step == load_checkpoint(whole).step == 8
    for a, b in zip(_params(whole), _params(parted), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    with TestClient(create_app(whole)) as client:
        response = client.get("/sample", params={"digit": 3, "n": 4, "seed": 1})
        assert response.status_code == 200
        assert response.content.startswith(b"\x89PNG")

    results = run_eval(whole, data_dir, EvalOptions(iwae_k=10, test_limit=32, fidelity=False),
                       json_path=tmp_path / "eval.json")
    assert np.isfinite(results["iwae"]["nll_conditional"])

    from cvae.export.run import export_checkpoint
    manifest = export_checkpoint(whole, tmp_path / "export", log=lambda message: None)
    assert manifest["files"]
    verify_folder(tmp_path / "export")
