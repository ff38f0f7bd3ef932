"""The chart's security defaults, on real `helm template` renders: Ray's control plane reachable only
from the release's own pods (NetworkPolicies, dashboard on loopback, Ray token authentication), the
Redis password and Ray token never generated per render and never on a command line, secrets only
where they are used, and pods that run as non-root with a read-only root filesystem.
Skipped when helm is not installed (tools/install_helm.sh)."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from tests.deploy.chart import RELEASE, VALUES_FILES, by_kind, env_of, helm, one, render, requires_helm, template_args

pytestmark = requires_helm

FULLNAME = f"{RELEASE}-baton"
CPU = VALUES_FILES["cpu"]
RAYJOB = ("launcher.mode=rayjob", "rayAuth.enabled=false")
SELECTOR = {"app.kubernetes.io/name": "baton", "app.kubernetes.io/instance": RELEASE}
RAY_ROLES = {"head", "router", "prefill", "decode"}


def ray_pod_templates(docs) -> dict[str, dict]:
    rc = one(docs, "RayCluster", FULLNAME)
    out = {"head": rc["spec"]["headGroupSpec"]["template"]}
    out.update({g["groupName"]: g["template"] for g in rc["spec"]["workerGroupSpecs"]})
    return out


def selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions with In) against a pod's labels."""
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def pod_labels(docs) -> dict[str, dict]:
    """Labels of every pod the release runs, by component."""
    out = {role: tpl["metadata"]["labels"] for role, tpl in ray_pod_templates(docs).items()}
    for sts in by_kind(docs, "StatefulSet"):
        out["redis"] = sts["spec"]["template"]["metadata"]["labels"]
    for job in by_kind(docs, "RayJob"):
        out["launcher"] = job["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    return out


def ingress_rules(docs, component: str) -> list[dict]:
    """The ingress rules of every NetworkPolicy that selects the pods of ``component``."""
    labels = pod_labels(docs)[component]
    return [
        rule
        for np in by_kind(docs, "NetworkPolicy")
        if selects(np["spec"]["podSelector"], labels)
        for rule in np["spec"].get("ingress", [])
    ]


def admitted(docs, component: str, peer_labels: dict, port: int) -> bool:
    """Whether a pod labelled ``peer_labels`` in the release's namespace may reach ``port`` on
    ``component``'s pods (an empty `from` admits anyone, an empty `ports` every port)."""
    for rule in ingress_rules(docs, component):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        if not peers or any(
            "podSelector" in p and "namespaceSelector" not in p and selects(p["podSelector"], peer_labels)
            for p in peers
        ):
            return True
    return False


# -- NetworkPolicies ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sets", [(), RAYJOB], ids=["head", "rayjob"])
def test_network_policies_keep_ray_and_redis_to_the_release(sets):
    docs = render([], sets)
    labels = pod_labels(docs)
    outsider = {"app": "something-else"}
    other_release = {**labels["router"], "app.kubernetes.io/instance": "other"}
    # every Ray pod and Redis is covered by a policy (a pod no policy selects admits everything)
    for component in RAY_ROLES | {"redis"}:
        assert ingress_rules(docs, component), component
    for component in RAY_ROLES:
        for port in (6379, 8265, 10001, 52365, 12345):  # GCS, dashboard, client, agent, a worker port
            for role in RAY_ROLES:
                assert admitted(docs, component, labels[role], port), (component, role, port)
            assert not admitted(docs, component, outsider, port) or (component == "router" and port in (8000, 50051))
            assert not admitted(docs, component, other_release, port), (component, port)
    # clients: only the routers' HTTP and gRPC ports
    for port in (8000, 50051):
        assert admitted(docs, "router", outsider, port)
    for component in ("head", "prefill", "decode", "redis"):
        assert not any(admitted(docs, component, outsider, port) for port in (8000, 50051, 6379, 8265))
    # Redis: only from the release's Ray pods
    for role in RAY_ROLES:
        assert admitted(docs, "redis", labels[role], 6379)
    assert not admitted(docs, "redis", outsider, 6379)
    if "launcher" in labels:  # the RayJob's submitter reaches the dashboard, and nothing else
        assert admitted(docs, "head", labels["launcher"], 8265)
        assert not admitted(docs, "head", labels["launcher"], 6379)
        assert not admitted(docs, "redis", labels["launcher"], 6379)


def test_network_policies_restrict_router_clients_and_can_be_disabled():
    gateway = '[{"podSelector": {"matchLabels": {"role": "gateway"}}}]'
    docs = render([], set_jsons=(f"networkPolicy.routerClients={gateway}",))
    assert admitted(docs, "router", {"role": "gateway"}, 8000)
    assert not admitted(docs, "router", {"role": "browser"}, 8000)
    assert not by_kind(render([], ("networkPolicy.enabled=false",)), "NetworkPolicy")
    external = render(CPU, ("redis.mode=external", "redis.url=redis://r:6379/0", "redis.auth.existingSecret=r"))
    assert f"{FULLNAME}-redis" not in {np["metadata"]["name"] for np in by_kind(external, "NetworkPolicy")}


def test_rayjob_mode_lets_the_kuberay_operator_read_the_dashboard():
    docs = render([], RAYJOB)
    operator = {"app.kubernetes.io/name": "kuberay-operator"}
    rules = ingress_rules(docs, "head")
    assert any(
        {"port": 8265, "protocol": "TCP"} in r.get("ports", [])
        and {"namespaceSelector": {}, "podSelector": {"matchLabels": operator}} in r.get("from", [])
        for r in rules
    )
    assert not any(
        operator == (p.get("podSelector") or {}).get("matchLabels")
        for r in ingress_rules(render([]), "head")
        for p in r.get("from", [])
    )


# -- Ray token authentication ------------------------------------------------------------------------
def test_ray_token_authentication_reaches_every_ray_process():
    docs = render([], ("autoscaling.enabled=true",))
    secret = one(docs, "Secret", f"{FULLNAME}-ray-auth")
    assert base64.b64decode(secret["data"]["auth_token"]).decode() == "test-ray-token-0123456789"
    ref = {"name": f"{FULLNAME}-ray-auth", "key": "auth_token"}
    for role, tpl in ray_pod_templates(docs).items():
        for c in tpl["spec"]["containers"]:  # Ray's containers and the head's launcher
            env = env_of(c)
            assert env["RAY_AUTH_MODE"]["value"] == "token", (role, c["name"])
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == ref, (role, c["name"])
    autoscaler = {e["name"]: e for e in one(docs, "RayCluster")["spec"]["autoscalerOptions"]["env"]}
    assert autoscaler["RAY_AUTH_MODE"]["value"] == "token"
    assert autoscaler["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == ref
    mine = [
        d
        for d in yaml.safe_load_all(
            helm(
                *template_args(
                    sets=(
                        "rayAuth.existingSecret=my-ray-token",
                        "rayAuth.secretKey=token",
                        "redis.auth.password=test-redis-password",
                    ),
                    secrets=False,
                )
            ).stdout
        )
        if d
    ]
    assert not [s for s in by_kind(mine, "Secret") if s["metadata"]["name"].endswith("ray-auth")]
    head = ray_pod_templates(mine)["head"]["spec"]["containers"][0]
    assert env_of(head)["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "my-ray-token", "key": "token"}
    off = render([], ("rayAuth.enabled=false",))
    assert "RAY_AUTH" not in json.dumps(off)


@pytest.mark.parametrize(
    "sets,message",
    [
        (("launcher.mode=rayjob",), "launcher.mode rayjob with rayAuth.enabled"),
        (("rayVersion=2.46.0",), "rayAuth.enabled needs Ray 2.52 or newer"),
    ],
)
def test_ray_auth_is_refused_where_it_cannot_work(sets, message):
    proc = helm(*template_args(sets=sets), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


# -- secrets: never generated per render, never on a command line, only where used -------------------
@pytest.mark.parametrize("missing,field", [("redis.auth.password", "redis.auth"), ("rayAuth.token", "rayAuth")])
def test_a_render_without_the_secret_fails_and_says_what_to_set(missing, field):
    """`helm template` (GitOps) cannot see the live Secret: a generated value would differ on every
    render and break authentication at the next pod restart. The chart asks for one instead."""
    given = [
        s
        for s in ("redis.auth.password=test-redis-password", "rayAuth.token=test-ray-token-0123456789")
        if not s.startswith(missing + "=")
    ]
    proc = helm(*template_args(sets=given, secrets=False), check=False)
    assert proc.returncode != 0
    assert f"{field}.existingSecret" in proc.stderr and f"{missing}" in proc.stderr, proc.stderr
    assert "GitOps" in proc.stderr


def test_existing_secrets_need_no_value_and_renders_are_stable():
    sets = ("redis.auth.existingSecret=my-redis", "rayAuth.existingSecret=my-ray")
    first = helm(*template_args(sets=sets, secrets=False)).stdout
    assert first == helm(*template_args(sets=sets, secrets=False)).stdout  # nothing random in a render
    assert "kind: Secret" not in first


def test_redis_reads_its_password_from_a_config_file():
    docs = render([])
    pod = one(docs, "StatefulSet", f"{FULLNAME}-redis")["spec"]["template"]["spec"]
    redis = pod["containers"][0]
    assert redis["command"] == ["redis-server", "/config/redis.conf"]
    assert "args" not in redis and "env" not in redis
    init = pod["initContainers"][0]
    script = init["args"][0]
    assert "requirepass" in script and "/secret/redis-password" in script
    assert "env" not in init  # read from the mounted Secret file, not an environment variable
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["password"]["secret"]["secretName"] == f"{FULLNAME}-redis"
    assert volumes["config"]["emptyDir"]["medium"] == "Memory"
    for probe in ("readinessProbe", "livenessProbe"):
        assert "$(cat /secret/redis-password)" in redis[probe]["exec"]["command"][-1]
    no_auth = one(render(CPU, ("redis.auth.enabled=false",)), "StatefulSet")["spec"]["template"]["spec"]
    assert "requirepass" not in no_auth["initContainers"][0]["args"][0]


def test_the_launcher_and_the_submitter_hold_no_redis_password():
    launcher = ray_pod_templates(render([]))["head"]["spec"]["containers"][1]
    assert launcher["name"] == "launcher" and "REDIS_PASSWORD" not in env_of(launcher)
    job = one(render([], RAYJOB), "RayJob")
    assert "secretKeyRef" not in json.dumps(job["spec"]["submitterPodTemplate"])


# -- pods ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(VALUES_FILES))
def test_pods_run_non_root_with_a_read_only_root_filesystem(variant):
    docs = render(VALUES_FILES[variant], ("autoscaling.enabled=true",) if variant == "gpu" else ())
    for role, tpl in ray_pod_templates(docs).items():
        spec = tpl["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, role
        assert spec["securityContext"]["runAsUser"] == 1000, role
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, role
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, (role, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]}, (role, c["name"])
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            # Ray's session dir, /tmp, the kernel cache and $HOME are writable emptyDirs
            for path in ("/tmp", "/tmp/ray", "/var/cache/baton-kernels", "/home/baton"):
                assert "emptyDir" in volumes[mounts[path]], (role, c["name"], path)
            env = env_of(c)
            if c["name"] != "fetch-model":
                assert env["HOME"]["value"] == "/home/baton"
        ray_env = env_of(spec["containers"][0])
        assert ray_env["BATON_KERNEL_CACHE"]["value"] == "/var/cache/baton-kernels"
        assert ray_env["BATON_CACHE_DIR"]["value"].startswith("/var/cache/baton/")  # the baton-cache emptyDir
    redis = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert redis["securityContext"]["runAsNonRoot"] is True
    for c in redis["containers"] + redis["initContainers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True


def _render_notes(tmp_path, sets) -> str:
    from tests.deploy.test_chart_render import render_notes

    return render_notes(tmp_path, sets)


def test_notes_warn_when_the_dashboard_is_exposed(tmp_path):
    quiet = _render_notes(tmp_path / "a", ())
    assert "WARNING" not in quiet
    assert "RAY_AUTH_MODE=token" in quiet
    loud = _render_notes(tmp_path / "b", ("head.exposeDashboard=true", "head.serviceType=LoadBalancer"))
    assert "WARNING: head.exposeDashboard is true" in loud and "LoadBalancer" in loud
    assert "runs any code on the cluster" in loud
