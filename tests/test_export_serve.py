"""`cvae serve` and `cvae sample` on an exported folder: the same endpoints and PNG bytes as
the checkpoint it came from, with no Orbax and no optimizer; a folder whose files do not match
its manifest is refused at start, naming the file; the page's /browser routes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvae.export.onnx_files import run_onnx
from cvae.sampling.sampler import load_sampler
from cvae.sampling.latents import request_latents
from servers import cvae_server
from service.app import create_app
from test_digit_image import encoded, seven


REQUESTS = [("GET", "/sample", {"digit": 3, "n": 9, "seed": 4}, None),
            ("GET", "/sample", {"n": 5, "seed": 11, "temperature": 0.7, "scale": 2}, None),
            ("GET", "/interpolate", {"digit": 2, "steps": 6, "seed": 1}, None),
            ("GET", "/interpolate", {"walk": "digits", "n": 2, "seed": 8}, None),
            ("POST", "/transfer", {"digits": [1, 7], "samples": 2, "seed": 3}, encoded(seven())),
            ("POST", "/classify", {}, encoded(seven()))]


def cvae(*args):
    return subprocess.run([sys.executable, "-m", "cvae.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_cvae_sample_of_an_export_writes_the_checkpoints_png_bytes(exported, export_runs,
                                                                   tmp_path):
    for source, png in ((export_runs("mixture").directory, "checkpoint.png"),
                        (exported("mixture"), "export.png")):
        result = cvae("sample", "--checkpoint-dir", source, "--digit", 4, "--n", 6, "--seed", 9,
                      "--scale", 2, "--out", tmp_path / png)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "export.png").read_bytes() == (tmp_path / "checkpoint.png").read_bytes()


def test_cvae_serve_of_an_export_answers_as_its_checkpoint(exported, export_runs, tmp_path):
    run = export_runs("few-labels")
    with TestClient(create_app(run.directory)) as checkpoint, \
            cvae_server(exported("few-labels"), tmp_path / "server.log") as server:
        ready = httpx.get(f"{server.url}/readyz").json()
        expected = checkpoint.get("/readyz").json()
        assert (ready["step"], ready["fingerprint"]) == (expected["step"],
                                                         expected["fingerprint"])
        for method, path, params, body in REQUESTS:
            ours = httpx.request(method, f"{server.url}{path}", params=params, content=body,
                                 timeout=60)
            theirs = checkpoint.request(method, path, params=params, content=body)
            assert ours.status_code == theirs.status_code == 200, (path, ours.text)
            assert ours.content == theirs.content, (path, params)
            assert ours.headers.get("etag") == theirs.headers.get("etag")
        assert "serving checkpoint step" in server.log()


@pytest.mark.parametrize("command", ["serve", "sample"])
def test_a_folder_whose_files_differ_from_its_manifest_is_refused_naming_the_file(
        command, exported, tmp_path):
    folder = shutil.copytree(exported("standard"), tmp_path / "model")
    with open(folder / "sample.onnx", "ab") as file:
        file.write(b"\0")
    extra = ("--port", "0") if command == "serve" else ("--out", tmp_path / "grid.png")
    result = cvae(command, "--checkpoint-dir", folder, *extra)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cvae {command}: error: "), result.stderr
    assert f"{folder / 'sample.onnx'}: its sha256 does not match manifest.json" in lines[0]
    (folder / "sample.onnx").unlink()
    result = cvae(command, "--checkpoint-dir", folder, *extra)
    assert result.returncode == 2 and "sample.onnx: listed in manifest.json but missing" \
        in result.stderr


def test_serving_an_export_loads_no_orbax_and_no_optimizer(exported):
    script = textwrap.dedent(f"""
        import sys
        from fastapi.testclient import TestClient
        from service.app import create_app
        with TestClient(create_app({str(exported("mixture"))!r})) as client:
            assert client.get("/sample", params={{"seed": 1, "n": 2}}).status_code == 200
            assert client.post("/transfer", content={encoded(seven())!r}).status_code == 200
        loaded = sorted(m for m in sys.modules if m.startswith(("orbax", "cvae.training")))
        assert not loaded, loaded
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_page_gets_the_served_models_sample_onnx(exported, export_runs):
    folder = exported("standard")
    with TestClient(create_app(folder)) as client:
        reply = client.get("/browser/sample.onnx")
        assert reply.status_code == 200
        assert reply.content == (folder / "sample.onnx").read_bytes()
        assert reply.headers["x-latent-dim"] == reply.headers["x-noise-dim"] == "4"
        script = client.get("/browser/ort/ort.wasm.min.js")
        assert script.status_code == 200 and script.headers["content-type"].startswith(
            "text/javascript")
        assert client.get("/browser/ort/ort-wasm-simd-threaded.wasm").headers[
            "content-type"] == "application/wasm"
        assert client.get("/browser/ort/ort.all.js").status_code == 404
        assert client.get("/browser/sampling.js").status_code == 200
    run = export_runs("mixture")  # a checkpoint directory: converted on first request
    with TestClient(create_app(run.directory)) as client:
        reply = client.get("/browser/sample.onnx")
        assert reply.status_code == 200
        assert reply.headers["x-checkpoint-step"] == str(max(run.steps))
    sampler = load_sampler(run.directory)
    noise, labels = request_latents(0, sampler.classes, 7, noise_width=sampler.noise_dim,
                                    temperature=1.0)
    images = run_onnx(reply.content, {"noise": noise, "label": labels})[0]
    assert np.max(np.abs(images - sampler.decode(noise, labels))) <= 1e-5
