"""The Baton image's Dockerfile and the plain-Ray example configs in deploy/ray (no helm, no Docker,
no Ray needed): the image has what KubeRay's probes run, and each example's documented
`ray job submit` command passes every secret its config references."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from baton.config import load_config
from tests.deploy.chart import ROOT

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
RAY_EXAMPLES = sorted((ROOT / "deploy" / "ray").glob("*.yaml"))


def _apt_installs(text: str) -> list[list[str]]:
    """The argument lists of every `apt-get install` in the Dockerfile's RUN lines."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        if not line.startswith("RUN "):
            continue
        for part in re.split(r"&&|;", line[4:]):
            words = shlex.split(part)
            if words[:2] == ["apt-get", "install"]:
                out.append(words[2:])
    return out


def test_image_has_wget_for_kuberay_exec_probes():
    """KubeRay (v1.3+, for Ray before 2.53) probes Ray containers with
    `wget ... http://localhost:52365/api/local_raylet_healthz`: without wget every probe fails."""
    installs = _apt_installs(DOCKERFILE.read_text())
    assert installs, "no apt-get install in the Dockerfile"
    packages = {w for args in installs for w in args if not w.startswith("-")}
    assert "wget" in packages
    for args in installs:
        assert "--no-install-recommends" in args, args


def _submit_command(text: str) -> str | None:
    """The `ray job submit ...` command documented in a config's leading comment, as shell text."""
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line[1:].strip())
    joined = re.sub(r"\\\n", " ", "\n".join(comment))
    found = [line for line in joined.splitlines() if line.startswith("ray job submit")]
    assert len(found) <= 1, found
    return found[0] if found else None


def _runtime_env_vars(command: str, env: dict[str, str]) -> dict[str, str]:
    """Run the documented command through bash with `ray` replaced by a function that prints its
    arguments, and return the env_vars of its --runtime-env-json."""
    echo_args = '-c "import json, sys; print(json.dumps(sys.argv[1:]))"'
    script = f'ray() {{ {shlex.quote(sys.executable)} {echo_args} "$@"; }}\n' + command
    proc = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
    )
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)
    if "--runtime-env-json" not in argv:
        return {}
    return json.loads(argv[argv.index("--runtime-env-json") + 1]).get("env_vars", {})


def _env_refs(node) -> set[str]:
    if isinstance(node, dict):
        refs = {node["env"]} if set(node) == {"env"} and isinstance(node["env"], str) else set()
        return refs.union(*(_env_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_env_refs(v) for v in node))
    return set()


def _node_env_names(text: str) -> set[str]:
    """Variables the comment sets in the environment of a documented `ray start` (NAME=... ray start)."""
    names = set()
    for line in text.splitlines():
        line = line.lstrip("#").strip()
        if "ray start" in line:
            names |= set(re.findall(r"\b([A-Z][A-Z0-9_]*)=\S*\s", line.split("ray start")[0] + " "))
    return names


@pytest.mark.parametrize("path", RAY_EXAMPLES, ids=lambda p: p.name)
def test_documented_job_submit_keeps_secrets_out_of_the_runtime_env(path, monkeypatch):
    """Ray stores a job's runtime env and shows it to anyone who lists jobs (`ray list jobs`, the
    dashboard): the documented command passes no secret there. The driver (`baton cluster` on the
    head) and the routers resolve every {env: NAME} reference from their node's environment, which
    the example sets on `ray start`."""
    import yaml

    text = path.read_text()
    cfg = load_config(path)
    refs = _env_refs(yaml.safe_load(text))
    command = _submit_command(text)
    assert command is not None, f"{path.name}: no `ray job submit` example in its comment"
    assert "--config " + str(path.relative_to(ROOT)) in command
    secrets = {name: f"value-of-{name}" for name in refs}
    env_vars = _runtime_env_vars(command, secrets)
    assert not refs & set(env_vars), f"{path.name}: secrets in --runtime-env-json: {sorted(refs & set(env_vars))}"
    assert not any(v in json.dumps(env_vars) for v in secrets.values())
    assert refs <= _node_env_names(text), f"{path.name}: say where {sorted(refs - _node_env_names(text))} are set"
    # what the driver does at start, with the node's environment set as documented
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    cfg.lane_policy()
    if cfg.redis.password is not None and cfg.redis.password.env is not None:
        assert cfg.redis_password() == secrets[cfg.redis.password.env]


def test_the_image_runs_as_a_non_root_user():
    """The chart's pods run as uid 1000 (runAsNonRoot) with a read-only root filesystem: the image's
    last USER is that uid, and the directories Baton writes are its own."""
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] == "1000"
    assert re.search(r"useradd[^\n]*--uid 1000", text)
    assert re.search(r"^ENV HOME=/home/baton", text, re.M)
    assert text.index("USER 1000") > max(text.index("RUN pip install"), text.rindex("COPY "))
