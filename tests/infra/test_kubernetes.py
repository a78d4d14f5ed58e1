"""The Kubernetes manifests, as rendered (``kubectl kustomize``), validated offline.

Core kinds against ``kubernetes-validate``'s bundled schemas (strict: an
unknown field fails); custom resources against the ``openAPIV3Schema`` of
their CRDs, checked into ``infra/kubernetes/schemas`` with their source.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from test_dashboard import exported_names

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "kubernetes"
OVERLAYS = ("keda", "knative", "gpu")
KUBERNETES_VERSION = "1.32.0"
CRDS = {
    "keda.sh/v1alpha1/ScaledObject": "keda.sh_scaledobjects.yaml",
    "http.keda.sh/v1alpha1/HTTPScaledObject": "http.keda.sh_httpscaledobjects.yaml",
    "monitoring.coreos.com/v1/ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "serving.knative.dev/v1/Service": "serving.knative.dev_services.yaml",
}


def _kubectl() -> str:
    """kubectl with a kustomize of v4 or later (the manifests use ``patches``), or skip."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: see https://kubernetes.io/docs/tasks/tools/")
    out = subprocess.run(
        [kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True
    ).stdout
    found = re.search(r'"kustomizeVersion":\s*"v(\d+)', out)
    if found is None or int(found.group(1)) < 4:
        pytest.skip(f"{kubectl} has no kustomize v4 or later (kubectl 1.21+ does)")
    return kubectl


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = _kubectl()
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@functools.cache
def _schema(kind_key: str) -> dict[str, Any]:
    crd = yaml.safe_load((K8S / "schemas" / CRDS[kind_key]).read_text())
    version = kind_key.split("/")[1]
    (spec,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return _strict(spec["schema"]["openAPIV3Schema"])


def _strict(schema: Any) -> Any:
    """The CRD's schema as JSON Schema that refuses fields it does not name (as the
    API server prunes them), except where the CRD preserves unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in schema and "additionalProperties" not in schema and not preserve:
            out["additionalProperties"] = False
        if schema.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if schema.get("nullable"):
            out.pop("nullable")
        return out
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    return schema


def _key(doc: dict[str, Any]) -> str:
    return f"{doc['apiVersion']}/{doc['kind']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        key = _key(doc)
        if key in CRDS:
            jsonschema.validate(doc, _schema(key))
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_ingress_controller_config_is_valid_and_defines_what_nginx_conf_does() -> None:
    doc = yaml.safe_load((K8S / "ingress-nginx-config.yaml").read_text())
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    conf = (ROOT / "infra" / "nginx" / "fnrt.conf").read_text()
    maps = conf[conf.index("map $uri") : conf.index("upstream fnrt")].strip()
    assert doc["data"]["http-snippet"].strip() == maps  # one routing, two places


def test_a_bad_object_fails_validation() -> None:
    # The checks above can fail: a misspelt field in a Deployment and in a ScaledObject.
    (deployment,) = [d for d in render("keda") if d["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    (scaled,) = [d for d in render("keda") if d["kind"] == "ScaledObject"]
    scaled["spec"]["maxReplicaCountt"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, _schema(_key(scaled)))


def test_the_deployment_drains_as_the_node_does() -> None:
    docs = render("keda")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (settings,) = [d for d in docs if d["kind"] == "ConfigMap" and "FNRT_STORE" in d["data"]]
    env = settings["data"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = pre_stop + float(env["FNRT_DRAIN_DELAY_S"]) + float(env["FNRT_SHUTDOWN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > needed  # SIGKILL only after the drain
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/cache/fnrt", "/dev/shm"} <= mounts  # L2 cache; workers' arenas
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    queries = [t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
    scaled_on = {
        name for q in queries for name in re.findall(r"(fnrt_\w+)\{", q["metadata"]["query"])
    }
    assert scaled_on == {"fnrt_queue_depth", "fnrt_running_batches", "fnrt_job_queued_records"}
    assert scaled_on <= exported_names()  # metrics the server really exports
    (dashboard,) = [d for d in docs if d["metadata"]["name"] == "fnrt-grafana-dashboard"]
    assert json.loads(dashboard["data"]["fnrt-dashboard.json"])["panels"]


#: kubectl's short names for the kinds docs/kubernetes.md names -> (apiVersion, kind).
_KINDS = {
    "svc": ("v1", "Service"),
    "service": ("v1", "Service"),
    "deploy": ("apps/v1", "Deployment"),
    "deployment": ("apps/v1", "Deployment"),
    "ksvc": ("serving.knative.dev/v1", "Service"),
    "secret": ("v1", "Secret"),
    "configmap": ("v1", "ConfigMap"),
    "ingress": ("networking.k8s.io/v1", "Ingress"),
}


def _doc_commands() -> list[tuple[str, tuple[str, ...]]]:
    """Each kubectl command of docs/kubernetes.md (blocks and inline code), with the
    overlays it is for: a block after ``<!-- overlay: NAME -->`` is for that overlay,
    a command naming a ksvc for Knative's, any other for every overlay."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    found: list[tuple[str, tuple[str, ...]]] = []
    for marker, body in re.findall(r"(?:<!-- overlay: (\w+) -->\n)?```sh\n(.*?)```", text, re.S):
        for line in body.replace("\\\n", " ").splitlines():
            if "kubectl" in line:
                found.append((line, (marker,) if marker else OVERLAYS))
    for inline in re.findall(r"`(kubectl [^`]+)`", text):
        found.append((inline, ("knative",) if " ksvc " in inline else OVERLAYS))
    return found


def test_the_kubernetes_doc_names_objects_each_overlay_has() -> None:
    commands = _doc_commands()
    assert any("port-forward" in c for c, _ in commands)
    created = {
        ("v1", "Secret", name)
        for c, _ in commands
        for name in re.findall(r"create secret generic ([\w-]+)", c)
    }
    checked = 0
    for overlay in OVERLAYS:
        docs = render(overlay)
        objects = {(d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in docs} | created
        templates = [
            d["spec"]["template"]["metadata"].get("labels", {})
            for d in docs
            if d["kind"] in ("Deployment", "Service") and "template" in d.get("spec", {})
        ]
        for command, overlays in commands:
            if overlay not in overlays or " -n fnrt " not in f" {command} ":
                continue
            named = re.findall(r"\b(\w+)/([\w-]+)\b", command.split("|")[0])
            named += re.findall(r"\bget (\w+) ([\w-]+)", command)
            for short, name in named:
                if short not in _KINDS:
                    continue
                api, kind = _KINDS[short]
                assert (api, kind, name) in objects, f"{overlay}: `{command}` names {kind} {name}"
                checked += 1
            for key, value in re.findall(r"-l ([\w./-]+)=([\w-]+)", command):
                assert any(t.get(key) == value for t in templates), (overlay, command)
                checked += 1
            if forward := re.search(r"port-forward svc/([\w-]+) \d+:(\d+)", command):
                (service,) = [
                    d
                    for d in docs
                    if d["kind"] == "Service" and d["metadata"]["name"] == forward[1]
                ]
                assert int(forward[2]) in [p["port"] for p in service["spec"]["ports"]]
    assert checked >= 4


def test_the_gpu_overlay_asks_for_a_gpu_and_runs_the_image_with_fnrt_gpu() -> None:
    docs = render("gpu")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    (settings,) = [d for d in docs if d["kind"] == "ConfigMap" and "FNRT_STORE" in d["data"]]
    assert settings["data"]["FNRT_DEVICE"] == "cuda"  # no GPU given: refused, not the CPU
    assert "nodeSelector" not in pod and "tolerations" not in pod  # the cluster's to choose
    patch = (K8S / "overlays" / "gpu" / "gpu.yaml").read_text()
    assert "# nodeSelector:" in patch and "# tolerations:" in patch  # but shown, commented
    tag = container["image"].rsplit(":", 1)[1]
    # the image it names is built by the Dockerfile's one documented GPU line
    dockerfile = (ROOT / "infra" / "docker" / "Dockerfile").read_text()
    (line,) = [line for line in dockerfile.splitlines() if f"-t fnrt:{tag} " in line]
    assert line.startswith("#   docker build ")  # one line to copy, with no index named
    assert "gpu" in line.split("FNRT_EXTRAS=")[1].split()[0].split(",")
