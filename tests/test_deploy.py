"""The container recipe and the Kubernetes manifests, checked without a cluster: every manifest
is valid against the Kubernetes API's schema (kubernetes-validate ships it), every volume and
claim they use is defined, their labels, autoscaler and disruption budget fit the Deployment,
their commands are valid `cvae` commands, their probes name routes the app serves and allow
the slowest start the docs record, and what they say to replace is said in one place. The
build context that .dockerignore leaves is listed as docker's Python client makes it; where
podman runs, the image is built from that context and its own command serves an export.
A half-copied export is shown not to be served until whole."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
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


def one(kind: str) -> dict:
    [document] = [d for d in documents() if d["kind"] == kind]
    return document


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

    # The deployment page's run of this command shows it serving that folder.
    page = (ROOT / "docs" / "service-deployment.md").read_text()
    run = page[page.index("### 3. Run it"):page.index("### 6. ")]
    served = re.findall(r"serving checkpoint step \d+ from (\S+)", run)
    served += re.findall(r'"checkpoint_dir":"([^"]+)"', run)
    assert len(served) >= 3 and set(served) == {args.checkpoint_dir}, served


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


def copy_file(source: Path, target: Path, limit: int | None = None) -> None:
    """Copy `source`, or its first `limit` bytes (a copy caught half-way), keeping its mtime as
    `tar` (and so `kubectl cp`) does."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes()[:limit])
    stat = source.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_half_copied_export_is_not_served_until_it_is_whole(exported, tmp_path):
    """A pod watches /exports/v1 while `kubectl cp` fills it file by file: with no manifest
    yet, with the manifest but the weights cut short, with the config missing, it serves
    nothing; once every file matches the manifest it serves the export. (The manifest arrives
    first here, with its final mtime, as tar sets it.)"""
    from cvae.export.manifest import MANIFEST
    from service.checkpoints import CheckpointWatcher

    source, target = exported("standard"), tmp_path / "exports" / "v1"
    watcher = CheckpointWatcher(target)  # polled by hand: refresh() is one poll
    watcher.refresh()
    assert watcher.current is None and "no checkpoint" in watcher.note

    copy_file(source / "model.safetensors", target / "model.safetensors")
    copy_file(source / "config.json", target / "config.json")
    watcher.refresh()  # no manifest yet: not an export, and no checkpoint either
    assert watcher.current is None and "no checkpoint" in watcher.note

    copy_file(source / MANIFEST, target / MANIFEST)
    (target / "config.json").unlink()
    watcher.refresh()  # the manifest lists a file that is not there yet
    assert watcher.current is None and "config.json: listed in" in watcher.note

    weights = (source / "model.safetensors").stat().st_size
    copy_file(source / "config.json", target / "config.json")
    copy_file(source / "model.safetensors", target / "model.safetensors", limit=weights // 2)
    watcher.refresh()  # the weights cut short: their sha256 differs from the manifest's
    assert watcher.current is None and "model.safetensors: its sha256" in watcher.note

    for path in sorted(source.iterdir()):  # the rest of the copy
        copy_file(path, target / path.name)
    watcher.refresh()
    assert watcher.current is not None, watcher.note
    assert watcher.current.step == json.loads((source / MANIFEST).read_text())["step"]
    assert watcher.note is None


def test_the_documented_copy_makes_an_export_appear_whole(exported, tmp_path):
    """docs/service-deployment.md's copy: into a temporary name, then `mv -T` (coreutils, as
    in the image) renames it into place in one step; a pod watching the final name sees
    nothing, then the whole export. `mv -T` refuses to move it into a folder that exists, so
    an export already served is never rewritten."""
    from service.checkpoints import CheckpointWatcher

    source, exports = exported("standard"), tmp_path / "exports"
    watcher = CheckpointWatcher(exports / "v2")
    partial = exports / ".v2.partial"
    for path in sorted(source.iterdir()):
        copy_file(path, partial / path.name)
        watcher.refresh()
        assert watcher.current is None and "no checkpoint" in watcher.note
    subprocess.run(["mv", "-T", str(partial), str(exports / "v2")], check=True)
    watcher.refresh()
    assert watcher.current is not None and watcher.note is None, watcher.note

    shutil.copytree(source, partial)
    refused = subprocess.run(["mv", "-T", str(partial), str(exports / "v2")],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and partial.is_dir(), refused.stderr


KUBERNETES = ROOT / "deploy" / "kubernetes.yaml"
DEPLOYMENT_PAGE = ROOT / "docs" / "service-deployment.md"


def replace_block() -> tuple[dict[str, str], str]:
    """deploy/kubernetes.yaml's block of what to replace: {"image": ..., "storage class": ...}
    and its sed line (the shell command, joined)."""
    block = re.search(r"^# =+ REPLACE BEFORE APPLYING =+\n(.*?)^# =+$", KUBERNETES.read_text(),
                      re.MULTILINE | re.DOTALL).group(1)
    values = {name: re.search(rf"^#\s+{name}\s+(\S+)", block, re.MULTILINE).group(1)
              for name in ("image", "storage class")}
    lines = [line.removeprefix("#").strip() for line in block.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("sed "))
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    return values, " ".join(line.removesuffix("\\") for line in lines[start:end + 1])


def test_what_to_replace_is_said_in_one_block_and_its_command_replaces_all_of_it():
    values, command = replace_block()
    images = {c["image"] for spec in pod_specs().values() for c in spec["containers"]}
    claims = [d for d in documents() if d["kind"] == "PersistentVolumeClaim"]
    assert images == {values["image"]}
    assert {claim["spec"].get("storageClassName") for claim in claims} == \
        {values["storage class"]}
    # The block's own command (sed, then `kubectl apply`), run with its placeholders as they
    # stand: no value of the block is left anywhere in what would be applied.
    pipeline = command.split(" | kubectl apply")[0]
    assert pipeline != command and pipeline.startswith("sed ")
    applied = subprocess.run(["bash", "-c", pipeline], cwd=ROOT, check=True, text=True,
                             capture_output=True).stdout
    settings = "\n".join(line for line in applied.splitlines() if not line.lstrip().startswith("#"))
    assert values["image"] not in settings and values["storage class"] not in settings
    replaced = [d for d in yaml.safe_load_all(applied) if d]
    assert {c["image"] for d in replaced for c in (
        d["spec"]["containers"] if d["kind"] == "Pod" else
        d["spec"]["template"]["spec"]["containers"] if d["kind"] == "Deployment" else [])} == \
        {"REGISTRY/cvae-serve:TAG"}
    assert {d["spec"]["storageClassName"] for d in replaced
            if d["kind"] == "PersistentVolumeClaim"} == {"CLASS"}
    # The deployment page says the same.
    page = DEPLOYMENT_PAGE.read_text()
    assert values["image"] in page and f"storageClassName: {values['storage class']}" in page


def quantity_bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]i)?", quantity).groups()
    return int(number) * 1024 ** (" KMGT".index(unit[0]) if unit else 0)


def test_the_claim_is_shared_by_every_node_and_holds_a_dozen_of_the_largest_exports():
    claim = one("PersistentVolumeClaim")["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"] and claim["storageClassName"]
    # Every export size the docs print ("exported step N of RUN to DIR (9 files, 88.3 MB)").
    sizes = [float(mb) for page in (ROOT / "docs").glob("*.md") for mb in re.findall(
        r"exported step \d+ of \S+ to \S+ \(\d+ files, ([\d.]+) MB\)", page.read_text())]
    assert len(sizes) >= 3 and max(sizes) >= 88  # the 32x32 colour model's among them
    assert quantity_bytes(claim["resources"]["requests"]["storage"]) >= 10 * max(sizes) * 1e6


def documented_starts() -> list[float]:
    """Every start of `cvae serve` the docs record, in seconds: the duration that begins each
    cell of a table row that says "(until /readyz answers 200)" ("33.0 s (load 2.2)", "4.5 min")."""
    rows = [line for page in (ROOT / "docs").glob("*.md") for line in page.read_text().splitlines()
            if line.startswith("|") and "(until /readyz answers 200)" in line]
    return [float(number) * (60 if unit == "min" else 1) for row in rows
            for number, unit in re.findall(r"\| ([\d.]+) (s|min)\b[^|]*(?=\|)", row)]


def test_the_startup_probe_allows_twice_the_slowest_documented_start():
    """A pod restarted before it can ever load would restart forever: the startup probe's window
    is at least twice the slowest start the docs record (4.5 minutes, a larger model on a busy
    machine), which include this page's own measurements of the default export."""
    starts = documented_starts()
    own = [line for line in DEPLOYMENT_PAGE.read_text().splitlines()
           if "(until /readyz answers 200)" in line]
    assert len(starts) >= 9 and own, starts
    probe = one("Deployment")["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    window = (probe.get("initialDelaySeconds", 0)
              + probe["periodSeconds"] * probe["failureThreshold"])
    assert window >= 2 * max(starts), (window, max(starts))
    # The image's HEALTHCHECK (plain `docker run`) does not count failures for as long.
    healthcheck = re.search(r"^HEALTHCHECK .*--start-period=(\d+)s",
                            (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert int(healthcheck.group(1)) >= 2 * max(starts)


def test_the_autoscaler_and_the_disruption_budget_fit_the_deployment():
    deployment, hpa, pdb = (one(kind) for kind in (
        "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget"))
    template = deployment["spec"]["template"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    replicas, low, high = (deployment["spec"]["replicas"], hpa["spec"]["minReplicas"],
                           hpa["spec"]["maxReplicas"])
    assert low <= replicas <= high and low < high  # applying the file again stays in range
    # The budget selects the Deployment's pods and no other, and lets one be evicted at a time
    # however few the autoscaler runs.
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    others = [spec for name, spec in pod_specs().items() if name != "cvae-serve"]
    assert others and not any(selector.items() <= d["metadata"].get("labels", {}).items()
                              for d in documents() if d["kind"] == "Pod")
    assert 1 <= pdb["spec"]["minAvailable"] < low
    # Utilization is measured against what each container requests, so each must request it.
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Resource" and metric["resource"]["target"]["type"] == \
            "Utilization"
        assert 0 < metric["resource"]["target"]["averageUtilization"] <= 100
        for container in template["spec"]["containers"]:
            assert metric["resource"]["name"] in container["resources"]["requests"]


DOCKERIGNORE = ROOT / ".dockerignore"


def build_context(root: Path) -> dict[str, int]:
    """The files `docker build root` sends and their sizes: the context as docker's Python
    client makes it (`docker.utils.tar`, with .dockerignore read as its `build` reads it)."""
    import tarfile

    import docker.utils

    patterns = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in patterns if line and not line.startswith("#")]
    with docker.utils.tar(str(root), exclude=patterns) as archive:
        with tarfile.open(fileobj=archive) as members:
            return {m.name: m.size for m in members.getmembers() if m.isfile()}


def test_the_build_context_leaves_out_everything_the_image_does_not_need(tmp_path):
    """A checkout with everything a working copy gathers, as empty files: only what the
    Dockerfile copies goes into the context (and the Dockerfile, which docker always sends)."""
    kept = ["Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "LICENSE",
            "cvae/__init__.py", "cvae/export/manifest.py", "service/app.py",
            "service/static/index.html", "service/web/package.json", "exported/manifest.json",
            "exported/model.safetensors", "exported-2/manifest.json"]
    left_out = [".venv/bin/python", ".venv-torch/lib/torch/lib/libtorch_cpu.so",
                "wheelhouse/jaxlib.whl", "runs/colour/1140/state", "site/index.html",
                "checkpoints/128/state", "checkpoints-seed/96/state", "data/mnist/train.idx",
                "service/web/node_modules/onnxruntime-web/dist/ort.wasm", ".git/HEAD",
                ".git/objects/pack/pack.pack", "cvae/__pycache__/cli.cpython-311.pyc",
                "service/__pycache__/app.cpython-311.pyc", ".pytest_cache/README.md",
                ".ruff_cache/content", "cvae.egg-info/PKG-INFO", "build/lib/cvae/cli.py",
                "tests/test_deploy.py", "docs/index.md", "bench/bench_train.py",
                "experiments/LOG.md", "reports/eval.json", "node_modules/x/index.js",
                "deploy/kubernetes.yaml", "scripts/x.py", ".ci/run", "Makefile",
                ".test-cpu-profile.tsv", "mkdocs.yml"]
    for name in kept + left_out:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    shutil.copy(DOCKERIGNORE, tmp_path / ".dockerignore")
    assert set(build_context(tmp_path)) == set(kept)


def test_the_build_context_of_this_checkout_is_the_package_and_nothing_git_ignores():
    context = build_context(ROOT)
    # Every file the Dockerfile copies is there: the whole package as git has it.
    tracked = subprocess.run(["git", "ls-files", "-z", "--", "cvae", "service", "pyproject.toml",
                              "README.md", "LICENSE"], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode().split("\0")
    assert {name for name in tracked if name and (ROOT / name).is_file()} <= set(context)
    # And nothing git ignores (.venv, caches, node_modules, data, runs...), but an export.
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-z"], cwd=ROOT,
                             input="\0".join(context).encode(),
                             capture_output=True).stdout.decode().split("\0")
    assert not [name for name in ignored if name and not name.startswith("exported")]
    package = sum(size for name, size in context.items() if not name.startswith("exported"))
    assert package < 5e6, package


# The image's base for the build below: Debian's own Python 3.11 (bookworm), as a root file
# system that mmdebstrap makes from Debian's packages, imported into podman. It stands in for
# the Dockerfile's `python:3.11-slim` (`podman build --from`), which comes from an image
# registry that this project's machines cannot reach. Kept in podman's store between runs.
BASE = "localhost/cvae-test-base:bookworm"


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *PODMAN_OPTIONS, *args], check=check, text=True,
                          capture_output=True, timeout=timeout)


PODMAN_OPTIONS: list[str] = []
RUN_OPTIONS: list[str] = []


def podman_runs_containers() -> str | None:
    """Sets the options podman needs to start a container here; None, or why it cannot."""
    if podman("image", "exists", BASE, check=False).returncode != 0:
        if not shutil.which("mmdebstrap"):
            return "no mmdebstrap to make the base image (apt-get install mmdebstrap)"
        with tempfile.TemporaryDirectory() as scratch:
            made = subprocess.run(
                ["mmdebstrap", "--variant=minbase", "--include=python3,python3-pip,"
                 "python-is-python3,ca-certificates",
                 # pip installs into the system's Python in an image, as in python:3.11-slim
                 "--customize-hook=rm -f \"$1\"/usr/lib/python3*/EXTERNALLY-MANAGED",
                 "bookworm", f"{scratch}/base.tar"], capture_output=True, text=True)
            if made.returncode != 0:
                return f"mmdebstrap failed: {made.stderr[-500:]}"
            podman("import", f"{scratch}/base.tar", BASE)
    # Plain podman first; else the runtime and limits a sandbox may need (a cgroup v1/v2
    # hybrid that crun refuses, rlimits a container may lower but not raise).
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    attempts = [([], []), (["--runtime", "runc", "--cgroup-manager", "cgroupfs"],
                           ["--ulimit", f"nofile={nofile}:{nofile}",
                            "--ulimit", "nproc=4096:4096"])]
    errors = []
    for options, run_options in attempts:
        if options and not shutil.which(options[1]):
            errors.append(f"no {options[1]} to try (apt-get install {options[1]})")
            continue
        PODMAN_OPTIONS[:], RUN_OPTIONS[:] = options, run_options
        ran = podman("run", "--rm", "--network", "none", *RUN_OPTIONS, BASE, "true", check=False)
        if ran.returncode == 0:
            return None
        errors.append(ran.stderr.strip()[-300:])
    return f"podman cannot start a container here: {errors}"


def test_the_image_builds_from_its_context_and_its_own_command_serves_an_export(exported,
                                                                               tmp_path):
    """Where podman runs, and asked for (CVAE_TEST_IMAGE=1: it takes minutes, and the package
    index): the image built from exactly the context .dockerignore leaves (and the export as
    `exported`), then its own command, unchanged, serving it: /readyz, a sample, uid 10001,
    and SIGTERM drains and exits 0. 2.5 minutes on a quiet 2-core machine, 6 on a busy one,
    most of it `pip install .` (and mmdebstrap's base image, the first time)."""
    if os.environ.get("CVAE_TEST_IMAGE") != "1":
        pytest.skip("builds the image: set CVAE_TEST_IMAGE=1 to run it (minutes)")
    if not shutil.which("podman"):
        pytest.skip("no podman (apt-get install podman mmdebstrap runc): the image is not "
                    "built")
    reason = podman_runs_containers()
    if reason:
        pytest.skip(reason)
    context = tmp_path / "context"
    for name in build_context(ROOT):
        if not name.startswith("exported"):  # the checkout's own exports, if any
            (context / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, context / name)
    shutil.copytree(exported("standard"), context / "exported")
    image, container = f"localhost/cvae-serve:test-{os.getpid()}", f"cvae-serve-test-{os.getpid()}"
    # The package index over the host's network, trusting the host's certificates.
    certificates = Path("/etc/ssl/certs/ca-certificates.crt")
    mounts = ["-v", f"{certificates}:{certificates}:ro"] if certificates.is_file() else []
    try:
        podman("build", "--from", BASE, "--format", "docker", "--layers=false",
               "--network", "host", *RUN_OPTIONS, *mounts, "-t", image, str(context))
        # Its own command, on a network of its own (nothing reaches the host's ports): the
        # checks run inside it, as its HEALTHCHECK does.
        podman("run", "-d", "--name", container, "--network", "none", *RUN_OPTIONS, image)
        probe = ("import sys, urllib.request as u; r = u.urlopen('http://127.0.0.1:8000' + "
                 "sys.argv[1], timeout=30); b = r.read(); print(r.status, "
                 "r.headers['content-type'], r.headers['x-checkpoint-step'], b[:8])")
        deadline = time.monotonic() + 600
        while (ready := podman("exec", container, "python", "-c", probe, "/readyz",
                               check=False)).returncode != 0:
            assert time.monotonic() < deadline, podman("logs", container).stderr
            time.sleep(2)
        assert ready.stdout.startswith("200 application/json")
        step = json.loads((exported("standard") / "manifest.json").read_text())["step"]
        sample = podman("exec", container, "python", "-c", probe,
                        "/sample?digit=7&n=4&seed=3").stdout
        assert sample.strip() == f"200 image/png {step} " + repr(b"\x89PNG\r\n\x1a\n")
        assert podman("exec", container, "id", "-u").stdout.strip() == "10001"
        logs = podman("logs", container).stderr
        assert f"serving checkpoint step {step} from /model" in logs
        podman("stop", "-t", "40", container)
        assert podman("inspect", container, "--format", "{{.State.ExitCode}}").stdout.strip() \
            == "0"
    finally:
        podman("rm", "-f", container, check=False)
        podman("rmi", "-f", image, check=False)
