"""The chart's values.schema.json, checked in Python (no helm needed): the shipped values files pass,
bad ones fail with a message naming the key, and the schema's `baton:` section stays in step with
Baton's own config schema (baton.config.BatonConfig)."""

from __future__ import annotations

import os
import shutil
import subprocess
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from baton.config import BatonConfig
from tests.deploy.chart import (
    BAD_VALUES,
    CHART,
    RENDER_BAD_VALUES,
    ROOT,
    VALUES_FILES,
    merge_values,
    values_errors,
    values_for,
    values_schema,
)

# The Baton config keys the chart sets itself (templates/_helpers.tpl, "baton.config").
CHART_OWNED = {
    "model": {"path"},
    "router": {"replicas", "host", "http_port", "grpc_port"},
    "pools": {"prefill", "decode"},
    "redis": {"url", "password"},
    "cluster": {"router_resource", "prefill_resource", "decode_resource", "router_cpus", "ray_address"},
}

# bad values file -> (dotted path of the offending value, words the message must contain)
BAD_CASES = {
    "negative_replicas": ("router.replicas", "minimum"),
    "replicas_as_string": ("decode.replicas", "is not of type 'integer'"),
    "unknown_key": ("(root)", "'prefil' was unexpected"),
    "inline_secret": ("baton.tenants.0.api_key", "is not valid under any of the given schemas"),
    "chart_owned_key": ("baton.router", "'replicas' was unexpected"),
    "bad_launcher_mode": ("launcher.mode", "is not one of ['head', 'rayjob']"),
    "block_size_not_power_of_two": ("baton.engine.block_size", "24 is not one of [1, 2, 4, 8, 16,"),
    "numeric_image_tag": ("image.tag", "1.1 is not of type 'string'"),
    "numeric_redis_tag": ("redis.image.tag", "7.4 is not of type 'string'"),
    "grpc_liveness_probe": ("router.probes.grpc", "is not one of ['readiness', 'none']"),
    "job_dependent_startup_probe": ("router.probes.grpc", "'startup' is not one of ['readiness', 'none']"),
    "percentage_disruption_budget": ("prefill.pdb.maxUnavailable", "'25%' is not of type 'integer'"),
    "empty_model_path": ("model.path", "should be non-empty"),
}


@pytest.mark.parametrize("variant", sorted(VALUES_FILES))
def test_shipped_values_files_match_the_schema(variant):
    assert values_errors(values_for(VALUES_FILES[variant])) == []


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_values_are_rejected_by_the_schema(case):
    path, words = BAD_CASES[case]
    errors = values_errors(values_for([BAD_VALUES / f"{case}.yaml"]))
    assert errors, f"{case}.yaml passed the schema"
    assert any(e.startswith(f"{path}: ") and words in e for e in errors), errors


def test_every_bad_values_file_has_a_case():
    assert {p.stem for p in BAD_VALUES.glob("*.yaml")} == set(BAD_CASES) | set(RENDER_BAD_VALUES)
    assert not set(BAD_CASES) & set(RENDER_BAD_VALUES)


@pytest.mark.parametrize("case", sorted(RENDER_BAD_VALUES))
def test_render_time_bad_values_pass_the_schema(case):
    """These are refused by the chart's templates (test_chart_render), not by the schema."""
    assert values_errors(values_for([BAD_VALUES / f"{case}.yaml"])) == []


def test_block_size_enum_is_what_baton_accepts():
    """The schema lists the block sizes Baton accepts (powers of two), up to its largest entry."""
    from pydantic import ValidationError

    from baton.config import EngineSection

    enum = values_schema()["properties"]["baton"]["properties"]["engine"]["properties"]["block_size"]["enum"]
    assert EngineSection().block_size in enum
    accepted = []
    for n in range(-1, max(enum) + 1):
        try:
            EngineSection(block_size=n)
        except ValidationError:
            continue
        accepted.append(n)
    assert accepted == sorted(enum)


def test_image_tags_are_strings():
    """A tag YAML reads as a number would render as `repo:%!s(float64=1.1)`; quoted, it passes."""
    for path, override in (
        ("image.tag", {"image": {"tag": 1.1}}),
        ("redis.image.tag", {"redis": {"image": {"tag": 7}}}),
    ):
        errors = values_errors(merge_values(values_for([]), override))
        assert errors and all(e.startswith(f"{path}: ") for e in errors), errors
    values = values_for([])
    values["image"]["tag"] = "1.10"
    values["redis"]["image"]["tag"] = "7.4"
    assert values_errors(values) == []


def _model_of(annotation) -> type[BaseModel] | None:
    """The pydantic model a field holds, directly or as list items (Optional unwrapped)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
        for inner in typing.get_args(candidate):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


def test_schema_baton_section_tracks_baton_config():
    """Every BatonConfig section and field is either accepted under `baton:` or set by the chart, and
    the schema accepts nothing Baton would reject as unknown. A new config field fails this test
    until values.schema.json (and, if the chart should set it, _helpers.tpl) knows about it."""
    sections = values_schema()["properties"]["baton"]["properties"]
    assert set(sections) == set(BatonConfig.model_fields), "values.schema.json baton sections vs BatonConfig"
    for name, field in BatonConfig.model_fields.items():
        model = _model_of(field.annotation)
        assert model is not None, name
        schema = sections[name]
        if schema.get("type") == "array":
            schema = schema["items"]
        chart_keys = set(schema["properties"]) | CHART_OWNED.get(name, set())
        assert chart_keys == set(model.model_fields), (
            f"baton.{name}: schema+chart keys {sorted(chart_keys)} != {model.__name__} fields "
            f"{sorted(model.model_fields)}"
        )
        assert not set(schema["properties"]) & CHART_OWNED.get(name, set()), f"baton.{name}: chart-owned key in schema"


def _secret_like(node, path=""):
    """(path, value) of every api_key / password in a values tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{path}.{k}" if path else k
            if k in ("api_key", "password"):
                yield p, v
            yield from _secret_like(v, p)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _secret_like(v, f"{path}.{i}")


@pytest.mark.parametrize("variant", sorted(VALUES_FILES))
def test_values_files_hold_no_inline_secrets(variant):
    for path, value in _secret_like(values_for(VALUES_FILES[variant])):
        assert value is None or (isinstance(value, dict) and set(value) <= {"env", "file"}), (path, value)


def test_gpu_values_take_tenant_keys_from_a_secret():
    values = values_for(VALUES_FILES["gpu"])
    refs = {t["api_key"]["env"] for t in values["baton"]["tenants"]}
    assert refs and refs <= {e["name"] for e in values["secretEnv"]}


def test_values_yaml_documents_the_chart_owned_keys():
    """values.yaml's comment above `baton:` lists what the chart sets; keep it in step."""
    text = (CHART / "values.yaml").read_text()
    head = text[: text.index("\nbaton:")]
    for section, keys in CHART_OWNED.items():
        for key in keys:
            assert key in head, f"values.yaml does not mention {section}.{key} as chart-owned"


def test_install_helm_without_npm_warns_and_succeeds(tmp_path):
    """Without npm the installer must not break `make test`: exit 0 with a warning."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("uname", "sha256sum", "cut", "mktemp", "rm", "tail", "tr"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (bindir / tool).symlink_to(found)
    bash = shutil.which("bash")  # found here: the run below has only bindir on its PATH
    assert bash is not None
    proc = subprocess.run(
        [bash, str(ROOT / "tools" / "install_helm.sh"), str(tmp_path / "venv")],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": str(bindir)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" in proc.stderr and "render tests will be skipped" in proc.stderr
    assert not (tmp_path / "venv" / "bin" / "helm").exists()


def test_shipped_values_files_are_plain_yaml_mappings():
    for files in VALUES_FILES.values():
        for f in files:
            assert isinstance(yaml.safe_load(Path(f).read_text()), dict), f
