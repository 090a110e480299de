"""The container recipe and the Kubernetes manifests cannot run here (no Docker engine, no
cluster), but what they say can be checked: every manifest is valid against the Kubernetes
API's schema (kubernetes-validate ships it), every volume and claim they use is defined, their
commands are valid `cvae` commands and their probes name routes the app serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from cvae.cli.main import build_parser
from service.app import create_app

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy").glob("*.yaml"))


def documents() -> list[dict]:
    return [d for path in MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]


def pod_specs() -> dict[str, dict]:
    """Every pod template of deploy/, by the name of what holds it."""
    specs = {}
    for document in documents():
        if document["kind"] == "Pod":
            specs[document["metadata"]["name"]] = document["spec"]
        elif "template" in document.get("spec", {}):
            specs[document["metadata"]["name"]] = document["spec"]["template"]["spec"]
    return specs


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
    # It serves the export the image carries (`COPY ${EXPORT} /model`).
    copied = re.search(r"^COPY (?:--\S+ )*\$\{EXPORT\} (\S+)$", text, re.MULTILINE).group(1)
    assert args.checkpoint_dir == copied
    probe = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", text)
    assert int(probe.group(1)) == args.port and probe.group(2) in routes()


def test_kubernetes_deployment_probes_and_command_match_the_app():
    deployment = next(d for d in documents() if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"][1:])
    assert container["args"][:2] == ["cvae", "serve"] and args.host == "0.0.0.0"
    # The folder served is a mounted volume's, chosen by a variable the container defines.
    variables = {v["name"] for v in container["env"]}
    used = set(re.findall(r"\$\((\w+)\)", args.checkpoint_dir))
    assert used <= variables
    assert any(args.checkpoint_dir.startswith(m["mountPath"] + "/")
               for m in container["volumeMounts"])
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


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_every_manifest_validates_against_the_kubernetes_api_schema(path):
    """Strict: a misspelt or misplaced field is an error, as `kubectl apply` would make it."""
    version = kubernetes_validate.latest_version()
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, version, strict=True)


def test_the_schema_check_refuses_a_misplaced_field():
    """The validation above can fail: a field where the API has none is refused."""
    deployment = next(d for d in documents() if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(),
                                     strict=True)


def test_every_volume_and_claim_used_is_defined():
    claims = {d["metadata"]["name"] for d in documents() if d["kind"] == "PersistentVolumeClaim"}
    specs = pod_specs()
    assert {"cvae-serve", "cvae-exports-loader"} <= set(specs)
    for name, spec in specs.items():
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        assert mounted <= set(volumes), name
        used = {v["persistentVolumeClaim"]["claimName"] for v in volumes.values()
                if "persistentVolumeClaim" in v}
        assert used <= claims, name


def test_the_service_selects_the_deployments_pods():
    deployment = next(d for d in documents() if d["kind"] == "Deployment")
    service = next(d for d in documents() if d["kind"] == "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
