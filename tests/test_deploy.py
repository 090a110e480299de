"""The container recipe and the Kubernetes example cannot run here (no Docker engine, no
cluster), but what they say about the app can be checked: their commands are valid `cvae`
commands and their probes name routes the app serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from cvae.cli import build_parser
from service.app import create_app

ROOT = Path(__file__).resolve().parents[1]


def routes() -> set[str]:
    """The paths the app documents. (Not `app.routes`: since FastAPI 0.137 an included router
    is one entry there, without a path.)"""
    return set(create_app("unused").openapi()["paths"])


def test_dockerfile_runs_a_valid_serve_command_on_all_interfaces():
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    command = json.loads(re.search(r"^CMD (\[.*\])$", text, re.MULTILINE).group(1))
    assert command[:2] == ["cvae", "serve"]
    args = build_parser().parse_args(command[1:])
    assert args.host == "0.0.0.0" and args.workers == "auto"
    assert args.checkpoint_dir == "/checkpoints"
    probe = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", text)
    assert int(probe.group(1)) == args.port and probe.group(2) in routes()


def test_kubernetes_deployment_probes_and_command_match_the_app():
    documents = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"][1:])
    assert container["args"][:2] == ["cvae", "serve"] and args.host == "0.0.0.0"
    assert {p["containerPort"] for p in container["ports"]} == {args.port}
    probes = {name: container[name]["httpGet"]["path"]
              for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"startupProbe": "/readyz", "readinessProbe": "/readyz",
                      "livenessProbe": "/healthz"}
    assert set(probes.values()) <= routes()
    # The pod may take longer to stop than the server's own graceful drain.
    from service.server import GRACEFUL_TIMEOUT_S
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > \
        GRACEFUL_TIMEOUT_S
