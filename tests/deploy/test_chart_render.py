"""The Helm chart rendered by a real helm (`helm template`) for the default, CPU and GPU values and a
few option combinations: every manifest validates (Kubernetes' schemas via kubernetes-validate; the
KubeRay RayCluster/RayJob and the ServiceMonitor via tests/deploy/schemas), Baton accepts the
ConfigMap's config.yaml, and the pieces agree with each other (replicas, GPUs, probes, ports, Redis).
Skipped when helm is not installed (tools/install_helm.sh)."""

from __future__ import annotations

import base64
import json
import re

import pytest
import yaml

from baton.config import BatonConfig
from tests.deploy.chart import (
    BAD_VALUES,
    CHART,
    RELEASE,
    RENDER_BAD_VALUES,
    SECRET_SETS,
    VALUES_FILES,
    baton_config,
    by_kind,
    env_of,
    helm,
    kuberay_errors,
    manifest_errors,
    one,
    ray_container,
    render,
    render_text,
    requires_helm,
    template_args,
    values_for,
)

pytestmark = requires_helm

FULLNAME = f"{RELEASE}-baton"
# emptyDirs every Baton container writes to under its read-only root filesystem
SCRATCH_MOUNTS = {
    "tmp": "/tmp",
    "ray-tmp": "/tmp/ray",
    "kernel-cache": "/var/cache/baton-kernels",
    "home": "/home/baton",
}
CPU, GPU = VALUES_FILES["cpu"], VALUES_FILES["gpu"]
# launcher.mode rayjob: KubeRay's operator cannot pass the chart's Ray token (test_rayjob_mode_refuses_ray_auth)
RAYJOB = ("launcher.mode=rayjob", "rayAuth.enabled=false")
EXTERNAL_REDIS = (
    "redis.mode=external",
    "redis.url=redis://redis.shared.svc:6379/3",
    "redis.auth.existingSecret=shared-redis",
    "redis.auth.secretKey=password",
)

# name -> (values files, --set values): every variant is rendered and validated.
VARIANTS = {
    "default": ([], ()),
    "cpu": (CPU, ()),
    "gpu": (GPU, ()),
    "cpu-rayjob": (CPU, RAYJOB),
    "gpu-rayjob-autoscaling": (GPU, RAYJOB + ("autoscaling.enabled=true",)),
    "cpu-autoscaling": (CPU, ("autoscaling.enabled=true", "router.minReplicas=1", "router.maxReplicas=3")),
    "external-redis": (CPU, EXTERNAL_REDIS),
    "ingress-servicemonitor": (
        [],
        (
            "ingress.enabled=true",
            "ingress.className=nginx",
            "serviceMonitor.enabled=true",
            "serviceMonitor.labels.release=prom",
        ),
    ),
    "no-redis-auth": (CPU, ("redis.auth.enabled=false",)),
}


def docs_for(variant: str) -> list[dict]:
    files, sets = VARIANTS[variant]
    return render(files, sets)


def raycluster(docs):
    return one(docs, "RayCluster", FULLNAME)


def groups(docs):
    rc = raycluster(docs)
    return {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}


def all_ray_containers(docs):
    """(pod role, container) for every container of every Ray pod template."""
    rc = raycluster(docs)
    out = [("head", c) for c in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]]
    for g in rc["spec"]["workerGroupSpecs"]:
        out += [(g["groupName"], c) for c in g["template"]["spec"]["containers"]]
    return out


# -- rendering and schemas -------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_validates(variant):
    docs = docs_for(variant)
    assert docs
    errors = [err for d in docs for err in manifest_errors(d)]
    assert errors == []


@pytest.mark.parametrize("variant", sorted(VALUES_FILES))
def test_helm_lint(variant):
    args = ["lint", "--strict", str(CHART), "--kube-version", "1.30.0"]
    for f in VALUES_FILES[variant]:
        args += ["-f", str(f)]
    for s in SECRET_SETS:  # lint renders in a mode where `fail` only logs: give what the chart needs
        args += ["--set", s]
    proc = helm(*args, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_the_validators_catch_errors():
    """The manifest checks are not vacuous: a broken Service, a RayCluster worker group without a
    name, a typo inside an embedded pod template, and a RayJob that names no cluster all fail."""
    docs = docs_for("cpu")
    svc = one(docs, "Service", FULLNAME)
    svc["spec"]["ports"][0]["port"] = "eight thousand"
    assert manifest_errors(svc)
    rc = raycluster(docs)
    del rc["spec"]["workerGroupSpecs"][0]["groupName"]
    assert any("groupName" in e for e in manifest_errors(rc))
    rc = raycluster(docs_for("cpu"))
    rc["spec"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]["resorces"] = {}
    assert any("resorces" in e for e in manifest_errors(rc))
    rc = raycluster(docs_for("cpu"))
    rc["spec"]["workerGroupSpecs"][1]["rayStartParams"]["num-cpus"] = 2
    assert manifest_errors(rc)
    job = one(render(CPU, RAYJOB), "RayJob")
    del job["spec"]["clusterSelector"]
    assert any("rayClusterSpec" in e for e in manifest_errors(job))
    # KubeRay's own validation: a per-group idle timeout without autoscaler v2
    rc = raycluster(docs_for("cpu-autoscaling"))
    rc["spec"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = 60
    assert any("autoscaler v2 is not enabled" in e for e in manifest_errors(rc))
    rc["spec"]["autoscalerOptions"]["version"] = "v2"
    assert kuberay_errors(rc) == []


# -- Baton's config --------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_configmap_is_a_config_baton_accepts(variant):
    docs = docs_for(variant)
    raw = baton_config(docs)
    cfg = BatonConfig.model_validate(raw)
    g = groups(docs)
    assert cfg.router.host == "0.0.0.0"
    assert cfg.router.replicas == g["router"]["replicas"]
    for role in ("prefill", "decode"):
        pod_units = _ray_resources(g[role])
        assert getattr(cfg.pools, role).workers == g[role]["replicas"] * pod_units[f"baton_{role}"]
    svc = one(docs, "Service", FULLNAME)
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert (cfg.router.http_port, cfg.router.grpc_port) == (ports["http"], ports["grpc"])
    assert cfg.cluster.router_resource == "baton_router"
    assert (cfg.cluster.prefill_resource, cfg.cluster.decode_resource) == ("baton_prefill", "baton_decode")
    assert cfg.cluster.ray_address is None  # RAY_ADDRESS comes from Ray's job supervisor
    assert cfg.redis.cluster_name == RELEASE


def _ray_resources(group: dict) -> dict:
    """rayStartParams `resources` is the JSON object KubeRay passes to `ray start --resources=`,
    wrapped in double quotes for the shell (as in KubeRay's samples)."""
    value = group["rayStartParams"]["resources"]
    assert value.startswith('"') and value.endswith('"'), value
    return json.loads(value[1:-1].replace('\\"', '"'))


def test_chart_owned_config_keys_fail_readably_without_the_schema():
    """The template refuses Baton config keys it sets, even with schema validation skipped."""
    proc = helm(*template_args(sets=("baton.router.replicas=3",)), "--skip-schema-validation", check=False)
    assert proc.returncode != 0
    assert "baton.router.replicas is set by the chart" in proc.stderr


# -- the Ray cluster -------------------------------------------------------------------------------
def test_head_offers_no_cpus_and_keeps_the_dashboard_local():
    """The dashboard's Jobs API runs any code on the cluster: it listens on loopback (the launcher and
    kubectl port-forward reach it there) unless exposed on purpose, or in rayjob mode, where KubeRay
    submits through the head Service (and the NetworkPolicy admits only the submitter and the operator)."""
    head = raycluster(docs_for("default"))["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert head["serviceType"] == "ClusterIP"
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports["dashboard"] == 8265
    launcher = head["template"]["spec"]["containers"][1]
    assert env_of(launcher)["BATON_DASHBOARD_URL"]["value"] == "http://127.0.0.1:8265"
    assert raycluster(docs_for("cpu-rayjob"))["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    exposed = raycluster(render([], ("head.exposeDashboard=true", "head.serviceType=LoadBalancer")))
    assert exposed["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert exposed["spec"]["headGroupSpec"]["serviceType"] == "LoadBalancer"


@pytest.mark.parametrize("service_type", ["NodePort", "LoadBalancer"])
def test_exposing_the_ray_head_needs_expose_dashboard(service_type):
    proc = helm(*template_args(sets=(f"head.serviceType={service_type}",)), check=False)
    assert proc.returncode != 0
    assert f"head.serviceType is {service_type}, which would expose the Ray head" in proc.stderr
    assert "head.exposeDashboard: true" in proc.stderr


def test_groups_offer_their_baton_resources():
    for variant in ("default", "cpu", "gpu"):
        g = groups(docs_for(variant))
        values = values_for(VALUES_FILES[variant])
        assert set(g) == {"router", "prefill", "decode"}
        assert _ray_resources(g["router"]) == {"baton_router": 1}
        for role in ("prefill", "decode"):
            assert _ray_resources(g[role]) == {f"baton_{role}": values[role]["workersPerPod"]}
            cpus = values[role]["workersPerPod"] * values[role]["cpusPerWorker"]
            assert int(g[role]["rayStartParams"]["num-cpus"]) >= cpus
        for role, group in g.items():
            assert all(isinstance(v, str) for v in group["rayStartParams"].values()), (role, group["rayStartParams"])


@pytest.mark.parametrize(
    "variant,expected",
    [
        ("default", {"router": (2, 2, 2), "prefill": (1, 1, 1), "decode": (1, 1, 1)}),
        ("cpu", {"router": (1, 1, 1), "prefill": (1, 1, 1), "decode": (1, 1, 1)}),
        ("gpu", {"router": (2, 2, 4), "prefill": (2, 2, 2), "decode": (2, 2, 2)}),
    ],
)
def test_group_replicas_and_bounds_follow_values(variant, expected):
    g = groups(docs_for(variant))
    got = {role: (g[role]["replicas"], g[role]["minReplicas"], g[role]["maxReplicas"]) for role in expected}
    assert got == expected


def test_replicas_and_bounds_from_set_values():
    docs = render(
        [],
        (
            "router.replicas=3",
            "router.minReplicas=1",
            "router.maxReplicas=5",
            "decode.replicas=4",
            "decode.workersPerPod=2",
            "decode.resources.requests.cpu=2",
        ),
    )
    g = groups(docs)
    assert (g["router"]["replicas"], g["router"]["minReplicas"], g["router"]["maxReplicas"]) == (3, 1, 5)
    cfg = baton_config(docs)
    assert cfg["router"]["replicas"] == 3
    assert cfg["pools"]["decode"]["workers"] == 8


def test_gpu_values_request_gpus_where_the_workers_run():
    docs = docs_for("gpu")
    g = groups(docs)
    values = values_for(GPU)
    for role in ("prefill", "decode"):
        c = ray_container(g[role])
        want = values[role]["workersPerPod"] * values[role]["gpusPerWorker"]
        assert c["resources"]["requests"]["nvidia.com/gpu"] == want
        assert c["resources"]["limits"]["nvidia.com/gpu"] == want
        assert g[role]["rayStartParams"]["num-gpus"] == str(want)
        spec = g[role]["template"]["spec"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    for role in ("router",):
        c = ray_container(g[role])
        assert "nvidia.com/gpu" not in json.dumps(c["resources"])
        assert "num-gpus" not in g[role]["rayStartParams"]
    head = raycluster(docs)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in json.dumps(head["resources"])
    cfg = BatonConfig.model_validate(baton_config(docs))
    # decode: TP-2 workers, one per pod, their two GPUs the group's total (test_chart_tensor_parallel.py)
    assert (cfg.pools.prefill.gpus, cfg.pools.decode.gpus) == (1, 2)
    assert cfg.pools.prefill.workers == 2 and cfg.pools.decode.workers == 2
    assert cfg.model.dtype == "bfloat16"


def test_cpu_values_request_no_gpus_anywhere():
    text = render_text(CPU)
    assert "nvidia.com/gpu" not in text
    assert "num-gpus" not in text
    cfg = BatonConfig.model_validate(baton_config(docs_for("cpu")))
    assert cfg.pools.prefill.gpus == cfg.pools.decode.gpus == 0
    assert cfg.model.path == "default"


def test_model_from_a_pvc_is_mounted_read_only_in_every_ray_pod():
    docs = docs_for("gpu")
    cfg = baton_config(docs)
    assert cfg["model"]["path"] == "/models/Llama-3.1-8B-Instruct"
    rc = raycluster(docs)
    templates = [("head", rc["spec"]["headGroupSpec"]["template"])] + [
        (g["groupName"], g["template"]) for g in rc["spec"]["workerGroupSpecs"]
    ]
    for role, tpl in templates:
        volumes = {v["name"]: v for v in tpl["spec"]["volumes"]}
        assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}, role
        mounts = {m["name"]: m for m in tpl["spec"]["containers"][0]["volumeMounts"]}
        assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}, role


def test_model_baked_into_the_image_needs_no_volume():
    for variant in ("default", "cpu"):
        rc = raycluster(docs_for(variant))
        for g in rc["spec"]["workerGroupSpecs"]:
            assert [v["name"] for v in g["template"]["spec"]["volumes"]] == [
                "baton-config",
                "baton-cache",
                *SCRATCH_MOUNTS,
            ]
            assert all("persistentVolumeClaim" not in v for v in g["template"]["spec"]["volumes"])
    cfg = baton_config(render([], ("model.path=/opt/models/qwen2.5-0.5b",)))
    assert cfg["model"]["path"] == "/opt/models/qwen2.5-0.5b"


# -- router: probes, Service, disruption budget -----------------------------------------------------
RAYLET_HEALTH = "wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success"


@pytest.mark.parametrize("variant", ["default", "cpu", "gpu"])
def test_router_probes(variant):
    """Startup depends on the pod's Ray node (its raylet, as KubeRay checks it), never on the job:
    the router binds only once a job runs, which the launcher's back-off alone can delay by minutes,
    and a failing startup probe restarts the pod. Readiness is Baton's /ready."""
    router = ray_container(groups(docs_for(variant))["router"])
    ports = {p["name"]: p["containerPort"] for p in router["ports"]}
    assert ports == {"http": 8000, "grpc": 50051}
    assert router["startupProbe"]["exec"]["command"] == ["bash", "-c", RAYLET_HEALTH]
    assert not {"grpc", "httpGet"} & set(router["startupProbe"])
    assert router["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}


@pytest.mark.parametrize("variant", ["default", "cpu", "gpu"])
def test_router_liveness_does_not_depend_on_baton_serving(variant):
    """Baton's router serves only while a job runs: a liveness probe on /health or gRPC health would
    restart the router containers (and their Ray nodes) after every job stop or crash. The router
    container declares none, so KubeRay gives it its Ray node (raylet) liveness check."""
    router = ray_container(groups(docs_for(variant))["router"])
    assert "livenessProbe" not in router
    assert {"startupProbe", "readinessProbe"} <= set(router)


@pytest.mark.parametrize("kind", ["readiness", "none"])
def test_router_grpc_health_probe_is_selectable(kind):
    router = ray_container(groups(render([], (f"router.probes.grpc={kind}",)))["router"])
    assert router["startupProbe"]["exec"]["command"] == ["bash", "-c", RAYLET_HEALTH]
    assert "livenessProbe" not in router
    if kind == "readiness":
        assert router["readinessProbe"]["grpc"] == {"port": 50051}
    else:
        assert "grpc" not in router["readinessProbe"]
        assert router["readinessProbe"]["httpGet"]["path"] == "/ready"


@pytest.mark.parametrize("variant", ["cpu-autoscaling", "gpu-rayjob-autoscaling"])
def test_autoscaling_sets_the_idle_timeout_once_for_autoscaler_v1(variant):
    """KubeRay refuses a worker group's idleTimeoutSeconds unless autoscaler v2 is enabled; the chart
    runs v1 and sets the idle timeout in autoscalerOptions, which applies to every group."""
    docs = docs_for(variant)
    spec = raycluster(docs)["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == 60
    assert spec["autoscalerOptions"].get("version", "v1") == "v1"
    for name, group in groups(docs).items():
        assert "idleTimeoutSeconds" not in group, name
    g = groups(docs)
    if variant == "cpu-autoscaling":
        assert (g["router"]["replicas"], g["router"]["minReplicas"], g["router"]["maxReplicas"]) == (1, 1, 3)


def test_autoscaling_idle_timeout_follows_values():
    rc = raycluster(render(CPU, ("autoscaling.enabled=true", "autoscaling.idleTimeoutSeconds=300")))
    assert rc["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] == 300
    assert not [g["groupName"] for g in rc["spec"]["workerGroupSpecs"] if "idleTimeoutSeconds" in g]


def test_worker_pods_keep_kuberays_probes():
    for role in ("prefill", "decode"):
        c = ray_container(groups(docs_for("gpu"))[role])
        assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(c), role


def test_router_service_ports_and_selector():
    docs = docs_for("default")
    svc = one(docs, "Service", FULLNAME)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["http"]["port"] == 8000 and ports["http"]["targetPort"] == "http"
    assert ports["grpc"]["port"] == 50051 and ports["grpc"]["targetPort"] == "grpc"
    assert ports["grpc"]["appProtocol"] == "grpc"
    selector = svc["spec"]["selector"]
    assert selector["app.kubernetes.io/component"] == "router"
    for role, group in groups(docs).items():
        labels = group["template"]["metadata"]["labels"]
        matches = all(labels.get(k) == v for k, v in selector.items())
        assert matches == (role == "router"), role
    head_labels = raycluster(docs)["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert not all(head_labels.get(k) == v for k, v in selector.items())


def test_disruption_budgets_are_integer_min_available_where_replicas_exceed_one():
    """The pods' owner is the RayCluster, whose CRD has no scale subresource: a maxUnavailable (or
    percentage) budget would let the disruption controller allow nothing and block every node
    drain. The chart renders minAvailable = replicas - pdb.maxUnavailable, only where replicas > 1."""
    docs = render([], ("prefill.replicas=3", "prefill.pdb.maxUnavailable=2", "decode.replicas=2"))
    pdbs = {p["metadata"]["name"]: p for p in by_kind(docs, "PodDisruptionBudget")}
    assert set(pdbs) == {f"{FULLNAME}-router", f"{FULLNAME}-prefill", f"{FULLNAME}-decode"}
    assert {name: p["spec"].get("minAvailable") for name, p in pdbs.items()} == {
        f"{FULLNAME}-router": 1,
        f"{FULLNAME}-prefill": 1,
        f"{FULLNAME}-decode": 1,
    }
    assert all("maxUnavailable" not in p["spec"] for p in pdbs.values())
    g = groups(docs)
    for role in g:
        selector = pdbs[f"{FULLNAME}-{role}"]["spec"]["selector"]["matchLabels"]
        for other, other_group in g.items():
            labels = other_group["template"]["metadata"]["labels"]
            assert all(labels.get(k) == v for k, v in selector.items()) == (other == role)
    # one pod (the default pools, values-cpu.yaml): no budget, which would only block drains
    default = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs_for("default"), "PodDisruptionBudget")}
    assert list(default) == [f"{FULLNAME}-router"] and default[f"{FULLNAME}-router"]["minAvailable"] == 1
    assert by_kind(docs_for("cpu"), "PodDisruptionBudget") == []
    assert by_kind(render([], ("router.pdb.maxUnavailable=2",)), "PodDisruptionBudget") == []  # would be 0
    gpu = {p["metadata"]["name"]: p["spec"]["minAvailable"] for p in by_kind(docs_for("gpu"), "PodDisruptionBudget")}
    assert gpu == {f"{FULLNAME}-router": 1, f"{FULLNAME}-prefill": 1, f"{FULLNAME}-decode": 1}


def test_router_prestop_drains_the_local_replica_within_the_grace_period():
    """preStop: wait while the Service drops the endpoints, then drain the pod's router replica over
    its local socket (baton.drain_socket) and return once drained; the grace period covers both."""
    for variant, drain in (("default", 30), ("cpu", 10)):
        spec = groups(docs_for(variant))["router"]["template"]["spec"]
        router = spec["containers"][0]
        socket = env_of(router)["BATON_DRAIN_SOCKET"]["value"]
        command = router["lifecycle"]["preStop"]["exec"]["command"]
        assert command[:3] == ["python", "-m", "baton.drain_socket"]
        args = dict(zip(command[3::2], command[4::2]))
        assert args == {"--socket": socket, "--sleep": "10", "--timeout": str(drain + 5)}
        assert socket.startswith("/tmp/")  # on the pod's writable /tmp emptyDir, shared with the replica
        assert spec["terminationGracePeriodSeconds"] >= 10 + drain + 5
    spec = groups(render([], ("baton.router.drain_timeout_s=120",)))["router"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= 10 + 120 + 5


def test_router_anti_affinity_selects_only_this_releases_routers():
    for variant in ("default", "gpu"):
        affinity = groups(docs_for(variant))["router"]["template"]["spec"]["affinity"]
        terms = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        selector = terms[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert selector == {
            "app.kubernetes.io/name": "baton",
            "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/component": "router",
        }, variant
    spec = groups(render([], ("router.spreadOverNodes=false",)))["router"]["template"]["spec"]
    assert "affinity" not in spec
    for role in ("prefill", "decode"):
        assert "affinity" not in groups(docs_for("default"))[role]["template"]["spec"]


def test_ingress_and_servicemonitor_are_optional():
    assert not by_kind(docs_for("default"), "Ingress")
    assert not by_kind(docs_for("default"), "ServiceMonitor")
    docs = docs_for("ingress-servicemonitor")
    ing = one(docs, "Ingress")
    backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": FULLNAME, "port": {"name": "http"}}
    assert ing["spec"]["ingressClassName"] == "nginx"
    sm = one(docs, "ServiceMonitor")
    # every router exports every worker's series: `replica` tells the copies apart (README)
    assert sm["spec"]["endpoints"] == [
        {
            "port": "http",
            "path": "/metrics",
            "interval": "15s",
            "scrapeTimeout": "10s",
            "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "replica"}],
        }
    ]
    assert sm["metadata"]["labels"]["release"] == "prom"
    svc_labels = one(docs, "Service", FULLNAME)["metadata"]["labels"]
    assert all(svc_labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    redis_labels = one(docs, "Service", f"{FULLNAME}-redis")["metadata"]["labels"]
    assert not all(redis_labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())


# -- the launcher ----------------------------------------------------------------------------------
def test_head_launcher_runs_baton_cluster():
    docs = docs_for("default")
    assert not by_kind(docs, "RayJob")
    spec = raycluster(docs)["spec"]["headGroupSpec"]["template"]["spec"]
    names = [c["name"] for c in spec["containers"]]
    assert names == ["ray-head", "launcher"]  # KubeRay takes the first container as Ray's
    launcher = spec["containers"][1]
    env = env_of(launcher)
    assert env["BATON_ENTRYPOINT"]["value"] == "python -m baton cluster --config /etc/baton/config.yaml"
    assert launcher["command"] == ["python", "/etc/baton/launcher.py", "run"]
    head = spec["containers"][0]
    assert head["lifecycle"]["preStop"]["exec"]["command"] == ["python", "/etc/baton/launcher.py", "stop"]
    assert env_of(head)["BATON_RELEASE"]["value"] == env["BATON_RELEASE"]["value"] == FULLNAME
    stop_wait = int(env_of(head)["RAY_JOB_STOP_WAIT_TIME_S"]["value"])
    assert stop_wait == int(env["RAY_JOB_STOP_WAIT_TIME_S"]["value"]) == 30 + 30  # drain_timeout_s + 30
    assert spec["terminationGracePeriodSeconds"] > stop_wait
    cm = one(docs, "ConfigMap", f"{FULLNAME}-config")
    assert cm["data"]["launcher.py"] == (CHART / "files" / "launcher.py").read_text()


def test_rayjob_mode():
    docs = docs_for("cpu-rayjob")
    job = one(docs, "RayJob", FULLNAME)
    spec = job["spec"]
    assert spec["entrypoint"] == "python -m baton cluster --config /etc/baton/config.yaml"
    assert spec["clusterSelector"] == {"ray.io/cluster": raycluster(docs)["metadata"]["name"]}
    assert spec["shutdownAfterJobFinishes"] is False
    assert spec["submissionMode"] == "K8sJobMode"
    drain = values_for(CPU)["baton"]["router"]["drain_timeout_s"]
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(drain + 30)}}
    # the head's preStop hook (launcher.py stop) finds the job by this metadata
    head_env = env_of(raycluster(docs)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0])
    assert spec["metadata"] == {"baton.release": head_env["BATON_RELEASE"]["value"]}
    submitter = spec["submitterPodTemplate"]["spec"]["containers"][0]
    assert "secretKeyRef" not in json.dumps(spec["submitterPodTemplate"])  # it never uses a secret
    assert submitter["securityContext"]["readOnlyRootFilesystem"] is True
    head = raycluster(docs)["spec"]["headGroupSpec"]["template"]["spec"]
    assert [c["name"] for c in head["containers"]] == ["ray-head"]
    # KubeRay submits only when every Ray pod is Ready: the routers must not wait for the job.
    router = ray_container(groups(docs)["router"])
    assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(router)


# -- Redis and secrets -----------------------------------------------------------------------------
def test_bundled_redis_and_its_password():
    docs = docs_for("default")
    sts = one(docs, "StatefulSet", f"{FULLNAME}-redis")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    secret = one(docs, "Secret", f"{FULLNAME}-redis")
    assert base64.b64decode(secret["data"]["redis-password"]).decode() == "test-redis-password"
    cfg = baton_config(docs)
    assert cfg["redis"]["url"] == f"redis://{FULLNAME}-redis:6379/0"
    assert cfg["redis"]["password"] == {"env": "REDIS_PASSWORD"}
    one(docs, "Service", f"{FULLNAME}-redis")
    for role, c in all_ray_containers(docs):
        if c["name"] == "launcher":  # submits the job; the job runs in the ray-head container
            assert "REDIS_PASSWORD" not in env_of(c)
            continue
        ref = env_of(c)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": f"{FULLNAME}-redis", "key": "redis-password"}, (role, c["name"])
    assert not by_kind(docs_for("cpu"), "PersistentVolumeClaim")
    assert "volumeClaimTemplates" not in one(docs_for("cpu"), "StatefulSet")["spec"]


def test_external_redis_takes_its_password_from_the_named_secret():
    docs = docs_for("external-redis")
    assert not by_kind(docs, "StatefulSet")
    assert [s["metadata"]["name"] for s in by_kind(docs, "Secret")] == [f"{FULLNAME}-ray-auth"]
    assert {s["metadata"]["name"] for s in by_kind(docs, "Service")} == {FULLNAME}
    cfg = baton_config(docs)
    assert cfg["redis"]["url"] == "redis://redis.shared.svc:6379/3"
    assert cfg["redis"]["password"] == {"env": "REDIS_PASSWORD"}
    for role, c in all_ray_containers(docs):
        if c["name"] != "launcher":
            ref = env_of(c)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "shared-redis", "key": "password"}, (role, c["name"])


def test_redis_without_auth_has_no_password_anywhere():
    docs = docs_for("no-redis-auth")
    assert "password" not in baton_config(docs)["redis"]
    assert [s["metadata"]["name"] for s in by_kind(docs, "Secret")] == [f"{FULLNAME}-ray-auth"]
    assert "redis-password" not in render_text(*VARIANTS["no-redis-auth"])
    for _, c in all_ray_containers(docs):
        assert "REDIS_PASSWORD" not in env_of(c)


def test_tenant_keys_come_from_the_users_secret():
    docs = docs_for("gpu")
    cfg = BatonConfig.model_validate(baton_config(docs))
    assert {t.api_key.env for t in cfg.tenants} == {"ACME_API_KEY", "GLOBEX_API_KEY"}
    for role, c in all_ray_containers(docs):
        if c["name"] == "launcher":
            continue
        env = env_of(c)
        assert env["ACME_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "baton-tenant-keys", "key": "acme"}, role
    assert "sk-" not in render_text(GPU)


# -- values the chart refuses ------------------------------------------------------------------------
# bad values file -> a regex the error must match (Helm 3.17's wording | Helm 3.18+'s wording)
HELM_BAD_CASES = {
    "negative_replicas": r"router[./]replicas'?: (Must be greater than or equal to 1|minimum: got -1, want 1)",
    "replicas_as_string": (
        r"decode[./]replicas'?: "
        r"(Invalid type\. Expected: integer, given: string|got string, want integer)"
    ),
    "unknown_key": r"(Additional property prefil is not allowed|additional properties 'prefil' not allowed)",
    "inline_secret": r"(api_key: Additional property value is not allowed|additional properties 'value' not allowed)",
    "chart_owned_key": (
        r"(baton\.router: Additional property replicas is not allowed"
        r"|additional properties 'replicas' not allowed)"
    ),
    "bad_launcher_mode": r"launcher[./]mode",
    "block_size_not_power_of_two": (
        r"baton[./]engine[./]block_size'?: "
        r".*(must be one of the following|value must be one of)"
    ),
    "numeric_image_tag": r"image[./]tag'?: (Invalid type\. Expected: string, given: number|got number, want string)",
    "numeric_redis_tag": (
        r"redis[./]image[./]tag'?: "
        r"(Invalid type\. Expected: string, given: number|got number, want string)"
    ),
    "grpc_liveness_probe": r"router[./]probes[./]grpc'?: .*(must be one of the following|value must be one of)",
    "job_dependent_startup_probe": r"router[./]probes[./]grpc'?: .*(must be one of the following|value must be one of)",
    "percentage_disruption_budget": (
        r"prefill[./]pdb[./]maxUnavailable'?: "
        r"(Invalid type\. Expected: integer, given: string|got string, want integer)"
    ),
}


@pytest.mark.parametrize("case", sorted(HELM_BAD_CASES))
def test_helm_rejects_bad_values_with_a_readable_message(case):
    proc = helm(*template_args([BAD_VALUES / f"{case}.yaml"]), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert re.search(HELM_BAD_CASES[case], proc.stderr), proc.stderr


@pytest.mark.parametrize("case", sorted(RENDER_BAD_VALUES))
def test_chart_rejects_bad_values_files_the_schema_lets_through(case):
    proc = helm(*template_args([BAD_VALUES / f"{case}.yaml"]), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" not in proc.stderr, proc.stderr
    assert RENDER_BAD_VALUES[case] in proc.stderr, proc.stderr


def test_numeric_tags_never_render_as_go_format_errors():
    """Quoted, a numeric-looking tag renders as written (the schema refuses it unquoted)."""
    text = render_text([], ("image.tag=1.10", "redis.image.tag=7.4"))  # --set keeps 1.10 a string
    assert "%!" not in text
    assert "image: ghcr.io/baton-llm/baton:1.10" in text
    assert "redis:7.4" in text
    proc = helm(*template_args(set_jsons=("image.tag=1.1",)), check=False)
    assert proc.returncode != 0 and "image" in proc.stderr and "tag" in proc.stderr


@pytest.mark.parametrize(
    "sets,message",
    [
        (("router.ports.grpc=8000",), "router.ports.http and router.ports.grpc are both 8000"),
        (("router.ports.http=9000", "router.ports.grpc=9000"), "router.ports.http and router.ports.grpc are both 9000"),
        (("router.minReplicas=3",), "router.minReplicas (3) is larger than router.replicas (2)"),
        (("decode.maxReplicas=0",), "decode.maxReplicas (0) is smaller than decode.replicas (1)"),
        (("model.source=pvc",), "model.source is pvc but model.pvc.claimName is empty"),
        (("redis.mode=external",), "redis.mode is external but redis.url is empty"),
        (
            ("redis.mode=external", "redis.url=redis://r:6379/0"),
            "name the Secret holding the password in redis.auth.existingSecret",
        ),
        (("prefill.resources.limits.nvidia\\.com/gpu=1",), "prefill.resources.limits sets nvidia.com/gpu"),
        (("router.rayStartParams.num-cpus=8",), "router.rayStartParams.num-cpus is set by the chart"),
        # The head takes no Baton actor: a GPU or a custom resource there would let one land on it.
        (("head.rayStartParams.num-gpus=1",), "head.rayStartParams.num-gpus is set by the chart"),
        (("head.rayStartParams.resources=x",), "head.rayStartParams.resources is set by the chart"),
    ],
)
def test_chart_rejects_inconsistent_values_with_a_readable_message(sets, message):
    proc = helm(*template_args(sets=sets), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


# CPU quantities in every form Kubernetes takes, against 2 workers x 1 Ray CPU: the exact amount
# renders, a millicore less fails.
CPU_ENOUGH = [("2", False), ("2000m", False), ("2.0", False), ("2e0", False), ("0.002k", False), (2, True), (2.5, True)]
CPU_SHORT = [("1999m", False), ("1.999", False), ("1999e-3", False), (1.999, True), ("1", False), ("500m", False)]


def _decode_cpu_sets(quantity, as_json: bool, kind: str = "requests"):
    other = "limits" if kind == "requests" else "requests"
    sets = ("decode.workersPerPod=2", f"decode.resources.{other}.cpu=null")
    value = f"decode.resources.{kind}.cpu={json.dumps(quantity) if as_json else quantity}"
    return (sets, (value,)) if as_json else (sets + (value,), ())


@pytest.mark.parametrize("kind", ["requests", "limits"])
@pytest.mark.parametrize("quantity,as_json", CPU_ENOUGH)
def test_cpu_quantities_that_cover_the_pods_ray_cpus_render(quantity, as_json, kind):
    sets, set_jsons = _decode_cpu_sets(quantity, as_json, kind)
    docs = render([], sets, set_jsons)
    c = ray_container(groups(docs)["decode"])
    assert str(c["resources"][kind]["cpu"]) == str(quantity)
    assert "cpu" not in c["resources"].get("limits" if kind == "requests" else "requests", {})


@pytest.mark.parametrize("kind", ["requests", "limits"])
@pytest.mark.parametrize("quantity,as_json", CPU_SHORT)
def test_cpu_quantities_below_the_pods_ray_cpus_fail(quantity, as_json, kind):
    sets, set_jsons = _decode_cpu_sets(quantity, as_json, kind)
    proc = helm(*template_args(sets=sets, set_jsons=set_jsons), check=False)
    assert proc.returncode != 0
    want = f"decode.resources.{kind}.cpu ({quantity}) is less than the 2 CPUs the pod's workers take from Ray"
    assert want in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "sets,set_jsons",
    [
        # no CPU request or limit at all: nothing to compare
        (("prefill.workersPerPod=4", "prefill.resources.requests.cpu=null", "prefill.resources.limits.cpu=null"), ()),
        # fractional Ray CPUs: 3 x 0.5 against 1500m, 3 threads against a limit of 3
        (
            ("prefill.workersPerPod=3", "prefill.resources.requests.cpu=1500m", "prefill.resources.limits.cpu=3"),
            ("prefill.cpusPerWorker=0.5",),
        ),
        # torch threads count on CPU only: a GPU worker's threadsPerWorker is not held against the limit
        (("image.variant=gpu", "decode.threadsPerWorker=8"), ("decode.gpusPerWorker=1",)),
        (("router.resources.requests.cpu=1500m", "router.resources.limits.cpu=2"), ("router.cpusPerReplica=1.5",)),
    ],
)
def test_consistent_cpu_values_render(sets, set_jsons):
    assert render([], sets, set_jsons)


# -- NOTES.txt ---------------------------------------------------------------------------------------
def render_notes(tmp_path, sets=()) -> str:
    """NOTES.txt as `helm install` would print it (helm template does not render it): a copy of the
    chart gets it as a partial and a ConfigMap that includes it."""
    import shutil

    chart = tmp_path / "baton"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    preview = '{{- define "notes.preview" -}}\n' + notes + "\n{{- end }}\n"
    (chart / "templates" / "_notes_preview.tpl").write_text(preview)
    (chart / "templates" / "notes-preview.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ include "notes.preview" . | toJson }}\n'
    )
    args = [
        "template",
        RELEASE,
        str(chart),
        "--namespace",
        "baton",
        "--kube-version",
        "1.30.0",
        "--show-only",
        "templates/notes-preview.yaml",
    ]
    for s in SECRET_SETS + tuple(sets):
        args += ["--set", s]
    return yaml.safe_load(helm(*args).stdout)["data"]["notes"]


@pytest.mark.parametrize("mode", ["head", "rayjob"])
def test_notes_tell_how_to_watch_reach_and_stop(tmp_path, mode):
    sets = RAYJOB if mode == "rayjob" else ()
    notes = render_notes(tmp_path, sets + ("ingress.enabled=true",))
    assert "<no value>" not in notes
    assert f"kubectl port-forward -n baton svc/{FULLNAME} 8000:8000 50051:50051" in notes
    assert f"helm uninstall -n baton {RELEASE}" in notes
    assert "http://baton.example.com" in notes
    if mode == "head":
        assert "-c launcher" in notes and "launcher.py stop" in notes
    else:
        assert f"kubectl get rayjob -n baton {FULLNAME}" in notes
