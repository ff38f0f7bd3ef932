"""Lazy safetensors loading: single file, sharded with an index, no index, and broken directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ModelLoadError
from engine.model.weights import atomic_model_dir, iter_safetensors, write_safetensors


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g),
        "model.layers.0.input_layernorm.weight": torch.ones(8),
        "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "lm_head.weight": torch.randn(16, 8, generator=g),
    }


def _sharded(tmp_path: Path, write_index: bool = True) -> tuple[Path, dict[str, torch.Tensor]]:
    t = _tensors()
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    weight_map = {}
    for file_name, shard_names in shards.items():
        save_file({n: t[n] for n in shard_names}, str(tmp_path / file_name))
        weight_map.update(dict.fromkeys(shard_names, file_name))
    if write_index:
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path, t


def _load(model_dir: Path) -> dict[str, tuple[torch.Tensor, str]]:
    return {name: (tensor, file_name) for name, tensor, file_name in iter_safetensors(model_dir)}


def test_single_file(tmp_path: Path) -> None:
    t = _tensors()
    save_file(t, str(tmp_path / "model.safetensors"))
    got = _load(tmp_path)
    assert set(got) == set(t)
    for name, (tensor, file_name) in got.items():
        assert file_name == "model.safetensors"
        assert tensor.dtype == t[name].dtype and torch.equal(tensor, t[name])


def test_sharded_with_index(tmp_path: Path) -> None:
    model_dir, t = _sharded(tmp_path)
    got = _load(model_dir)
    assert set(got) == set(t)
    assert {f for _, f in got.values()} == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert all(torch.equal(got[n][0], t[n]) for n in t)


def test_sharded_without_index(tmp_path: Path) -> None:
    model_dir, t = _sharded(tmp_path, write_index=False)
    got = _load(model_dir)
    assert set(got) == set(t)


def test_is_lazy(tmp_path: Path) -> None:
    model_dir, _ = _sharded(tmp_path)
    it = iter_safetensors(model_dir)
    name, tensor, _ = next(it)  # a generator: nothing else has been read yet
    assert isinstance(tensor, torch.Tensor) and name


def test_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found") as e:
        list(iter_safetensors(tmp_path / "nope"))
    assert "nope" in str(e.value)


def test_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no weights files") as e:
        list(iter_safetensors(tmp_path))
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("keep", [4, 100, -64])
def test_truncated_file(tmp_path: Path, keep: int) -> None:
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:keep])
    with pytest.raises(ModelLoadError, match=r"model.safetensors") as e:
        list(iter_safetensors(tmp_path))
    assert "truncated" in str(e.value) or "corrupt" in str(e.value)


def test_garbage_header(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{not json at all...}" + b"\0" * 32)
    with pytest.raises(ModelLoadError, match="corrupt safetensors header"):
        list(iter_safetensors(tmp_path))


def test_index_names_missing_shard(tmp_path: Path) -> None:
    model_dir, _ = _sharded(tmp_path)
    (model_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002.safetensors") as e:
        list(iter_safetensors(model_dir))
    assert "does not exist" in str(e.value)


def test_index_lists_tensor_missing_from_shard(tmp_path: Path) -> None:
    model_dir, _ = _sharded(tmp_path)
    index_path = model_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.7.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"model.layers.7.mlp.up_proj.weight") as e:
        list(iter_safetensors(model_dir))
    assert "model-00001-of-00002.safetensors" in str(e.value)


def test_invalid_index_json(tmp_path: Path) -> None:
    model_dir, _ = _sharded(tmp_path)
    (model_dir / "model.safetensors.index.json").write_text("{oops")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors\.index\.json: invalid JSON"):
        list(iter_safetensors(model_dir))


def test_streaming_writer_roundtrip(tmp_path: Path) -> None:
    t = _tensors(1)
    t["scalar"] = torch.tensor(3.5)
    specs = [(n, v.dtype, tuple(v.shape)) for n, v in t.items()]
    write_safetensors(tmp_path / "model.safetensors", specs, iter(t.items()), metadata={"format": "pt"})
    back = load_file(str(tmp_path / "model.safetensors"))
    assert set(back) == set(t) and all(torch.equal(back[n], t[n]) for n in t)


def test_streaming_writer_rejects_mismatch(tmp_path: Path) -> None:
    specs = [("a", torch.float32, (2,))]
    with pytest.raises(ValueError, match="expected a"):
        write_safetensors(tmp_path / "x.safetensors", specs, iter([("a", torch.zeros(3))]))


def test_atomic_model_dir(tmp_path: Path) -> None:
    out = tmp_path / "m"
    with pytest.raises(RuntimeError), atomic_model_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("interrupted")
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing half-written is left
    with atomic_model_dir(out) as tmp:
        (tmp / "a").write_text("1")
    with atomic_model_dir(out) as tmp:  # replacing an existing directory
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
