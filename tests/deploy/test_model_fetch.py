"""Filling the model claim: the chart's ``fetch-model`` init container for ``model.source``
``hf://org/name`` and ``pvc://claim/dir`` (rendered by a real helm), and its script
(deploy/helm/baton/files/fetch_model.py) against local directories, with the Hugging Face download
stubbed at its boundary (no network)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.deploy.chart import (
    CHART,
    RELEASE,
    baton_config,
    env_of,
    helm,
    manifest_errors,
    one,
    render,
    requires_helm,
    template_args,
)

FULLNAME = f"{RELEASE}-baton"
HF = (
    "model.source=hf://Qwen/Qwen2.5-0.5B-Instruct@main",
    "model.path=qwen",
    "model.pvc.claimName=models",
    "model.hf.tokenSecret.name=hf-token",
)


@pytest.fixture
def fetch_model(monkeypatch, tmp_path):
    monkeypatch.setenv("BATON_MODEL_SOURCE_ROOT", str(tmp_path / "source-claim"))
    spec = importlib.util.spec_from_file_location("baton_chart_fetch_model", CHART / "files" / "fetch_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _model_dir(path, weights=b"weights"):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(weights)
    (path / "sub").mkdir()
    (path / "sub" / "tokenizer.json").write_text("{}")
    return path


# -- the script --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,kind,location,revision,claim",
    [
        ("hf://Qwen/Qwen2.5-0.5B-Instruct", "hf", "Qwen/Qwen2.5-0.5B-Instruct", None, None),
        ("hf://meta-llama/Llama-3.1-8B-Instruct@0e9e39f", "hf", "meta-llama/Llama-3.1-8B-Instruct", "0e9e39f", None),
        ("pvc://weights/llama/8b/", "pvc", "llama/8b", None, "weights"),
        ("pvc://weights", "pvc", "", None, "weights"),
    ],
)
def test_sources_parse(fetch_model, text, kind, location, revision, claim):
    src = fetch_model.parse_source(text)
    assert (src.kind.value, src.location, src.revision, src.claim) == (kind, location, revision, claim)
    assert fetch_model.parse_source(src.describe()) == src


@pytest.mark.parametrize(
    "text,words",
    [
        ("hf://just-a-name", "hf://org/name"),
        ("hf://org/name/extra", "hf://org/name"),
        ("hf://org/name@", "empty revision"),
        ("pvc://", "pvc://claim"),
        ("pvc://weights/../../etc", "'..'"),
        ("s3://bucket/model", "hf://org/name[@revision] or pvc://claim/dir"),
    ],
)
def test_bad_sources_are_named(fetch_model, text, words):
    with pytest.raises(ValueError, match=None) as e:
        fetch_model.parse_source(text)
    assert words in str(e.value)


def test_a_claim_directory_is_copied_once_and_replaced_when_the_source_changes(fetch_model, tmp_path):
    root = tmp_path / "source-claim"
    _model_dir(root / "llama" / "8b")
    dest = tmp_path / "models" / "llama"
    src = fetch_model.parse_source("pvc://weights/llama/8b")
    said: list[str] = []
    assert fetch_model.fetch(src, dest, log=said.append) is True
    assert (dest / "model.safetensors").read_bytes() == b"weights"
    assert (dest / "sub" / "tokenizer.json").exists()
    assert (dest / fetch_model.MARKER).read_text().strip() == "pvc://weights/llama/8b"
    assert [p.name for p in dest.parent.iterdir()] == ["llama"]  # no partial copy left beside it
    # a pod restart: the marker says it is there already
    (root / "llama" / "8b" / "model.safetensors").write_bytes(b"changed")
    assert fetch_model.fetch(src, dest, log=said.append) is False
    assert (dest / "model.safetensors").read_bytes() == b"weights"
    # another source: the model is replaced, nothing of the old one stays
    _model_dir(root / "qwen", weights=b"qwen")
    (dest / "stale.bin").write_bytes(b"x")
    assert fetch_model.fetch(fetch_model.parse_source("pvc://weights/qwen"), dest, log=said.append) is True
    assert (dest / "model.safetensors").read_bytes() == b"qwen"
    assert not (dest / "stale.bin").exists()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["llama"]


def test_a_copy_cut_off_half_way_is_never_taken_for_a_model(fetch_model, tmp_path, monkeypatch):
    root = tmp_path / "source-claim"
    _model_dir(root / "m")
    dest = tmp_path / "models" / "m"

    def dies(src, target):
        target.mkdir()
        (target / "config.json").write_text("{}")
        raise OSError("the pod was killed")

    monkeypatch.setattr(fetch_model, "copy_tree", dies)
    with pytest.raises(OSError):
        fetch_model.fetch(fetch_model.parse_source("pvc://weights/m"), dest, log=lambda _: None)
    assert not dest.exists()
    monkeypatch.undo()
    monkeypatch.setenv("BATON_MODEL_SOURCE_ROOT", str(root))
    assert fetch_model.fetch(fetch_model.parse_source("pvc://weights/m"), dest, log=lambda _: None) is True
    assert (dest / "model.safetensors").exists()


def test_a_missing_source_directory_fails_readably(fetch_model, tmp_path):
    with pytest.raises(SystemExit, match="is not a directory on the source claim"):
        fetch_model.fetch(fetch_model.parse_source("pvc://weights/nope"), tmp_path / "m", log=lambda _: None)


def test_hf_sources_download_with_the_token_and_revision(fetch_model, tmp_path, monkeypatch):
    calls = []

    def fake_download(repo, revision, target, token):
        calls.append((repo, revision, target.name, token))
        _model_dir(target / "inner")
        (target / ".cache" / "huggingface").mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(fetch_model, "hf_download", fake_download)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    dest = tmp_path / "models" / "qwen"
    assert fetch_model.main(["fetch_model.py", "hf://Qwen/Qwen2.5-0.5B-Instruct@main", str(dest)]) == 0
    assert calls == [("Qwen/Qwen2.5-0.5B-Instruct", "main", ".qwen.partial", "hf_secret")]
    assert (dest / "config.json").exists() and not (dest / ".cache").exists()
    assert fetch_model.main(["fetch_model.py", "hf://Qwen/Qwen2.5-0.5B-Instruct@main", str(dest)]) == 0
    assert len(calls) == 1  # already there
    monkeypatch.delenv("HF_TOKEN")
    assert fetch_model.main(["fetch_model.py", "hf://Qwen/Qwen2.5-0.5B-Instruct", str(dest)]) == 0
    assert calls[-1] == ("Qwen/Qwen2.5-0.5B-Instruct", None, ".qwen.partial", None)


def test_bad_arguments_exit_2(fetch_model, capsys):
    assert fetch_model.main(["fetch_model.py"]) == 2
    assert fetch_model.main(["fetch_model.py", "ftp://x", "/models/x"]) == 2
    assert "hf://org/name" in capsys.readouterr().err


# -- the chart ---------------------------------------------------------------------------------------
@requires_helm
def test_hf_source_fills_the_claim_from_the_head_pod_before_the_job():
    docs = render([], HF)
    assert [e for d in docs for e in manifest_errors(d)] == []
    assert baton_config(docs)["model"]["path"] == "/models/qwen"
    rc = one(docs, "RayCluster", FULLNAME)
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    [init] = head["initContainers"]
    assert init["command"] == [
        "python",
        "/etc/baton/fetch_model.py",
        "hf://Qwen/Qwen2.5-0.5B-Instruct@main",
        "/models/qwen",
    ]
    assert env_of(init)["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    mounts = {m["name"]: m for m in init["volumeMounts"]}
    assert mounts["model-fill"]["mountPath"] == "/models" and not mounts["model-fill"].get("readOnly")
    volumes = {v["name"]: v for v in head["volumes"]}
    assert volumes["model-fill"]["persistentVolumeClaim"] == {"claimName": "models"}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    # workers mount the claim read-only and fetch nothing themselves
    for g in rc["spec"]["workerGroupSpecs"]:
        spec = g["template"]["spec"]
        assert "initContainers" not in spec
        assert {v["name"]: v for v in spec["volumes"]}["model"]["persistentVolumeClaim"]["readOnly"] is True
    cm = one(docs, "ConfigMap", f"{FULLNAME}-config")
    assert cm["data"]["fetch_model.py"] == (CHART / "files" / "fetch_model.py").read_text()
    assert "HF_TOKEN" not in str(head["containers"])  # only the init container holds the token


@requires_helm
def test_pvc_source_mounts_the_source_claim_read_only():
    docs = render([], ("model.source=pvc://weights/llama/8b", "model.path=llama", "model.pvc.claimName=models"))
    head = one(docs, "RayCluster", FULLNAME)["spec"]["headGroupSpec"]["template"]["spec"]
    [init] = head["initContainers"]
    assert init["command"][2:] == ["pvc://weights/llama/8b", "/models/llama"]
    assert {m["name"]: m for m in init["volumeMounts"]}["model-source"] == {
        "name": "model-source",
        "mountPath": "/model-source",
        "readOnly": True,
    }
    assert {v["name"]: v for v in head["volumes"]}["model-source"]["persistentVolumeClaim"] == {
        "claimName": "weights",
        "readOnly": True,
    }
    assert "HF_TOKEN" not in str(init)


@requires_helm
def test_image_and_pvc_sources_fetch_nothing():
    for sets in ((), ("model.source=pvc", "model.pvc.claimName=models", "model.path=m")):
        docs = render([], sets)
        head = one(docs, "RayCluster", FULLNAME)["spec"]["headGroupSpec"]["template"]["spec"]
        assert "initContainers" not in head
        assert "fetch_model.py" not in one(docs, "ConfigMap", f"{FULLNAME}-config")["data"]


@requires_helm
@pytest.mark.parametrize(
    "sets,message",
    [
        (("model.source=hf://org/name",), "model.source is hf://org/name but model.pvc.claimName is empty"),
        (
            ("model.source=hf://org/name", "model.pvc.claimName=models", "model.path=/"),
            "set model.path to the directory on the claim to fill",
        ),
        (
            ("model.source=pvc://models/x", "model.pvc.claimName=models", "model.path=m"),
            "copies from model.pvc.claimName itself",
        ),
    ],
)
def test_inconsistent_fetch_values_fail_readably(sets, message):
    proc = helm(*template_args(sets=sets), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@requires_helm
def test_the_schema_refuses_an_unknown_source():
    proc = helm(*template_args(sets=("model.source=s3://bucket/model",)), check=False)
    assert proc.returncode != 0 and "model" in proc.stderr and "source" in proc.stderr
