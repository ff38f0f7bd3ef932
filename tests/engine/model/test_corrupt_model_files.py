"""Corrupt model files are a ModelLoadError naming the file, not a KeyError / TypeError traceback
(found by an audit of `baton generate` / `baton chat` on damaged model directories)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.errors import ModelLoadError
from engine.model.config import ModelConfig
from engine.model.tokenizer import Tokenizer
from engine.model.weights import iter_safetensors


def _with_header_entry(tmp_path: Path, entry: object) -> Path:
    """A one-tensor safetensors file whose header entry for 'w' is replaced by ``entry``."""
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(2, 2)}, str(path))
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header["w"] = entry
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    return path


@pytest.mark.parametrize(
    "entry, needle",
    [
        ({"dtype": "F32", "shape": [2, 2]}, "data_offsets must be [begin, end]"),  # was KeyError('data_offsets')
        ({"dtype": "F32", "shape": [2, 2], "data_offsets": ["0", "16"]}, "got ['0', '16']"),
        ({"dtype": "F32", "shape": [2, 2], "data_offsets": [0]}, "data_offsets must be"),
        ({"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 0]}, "0 <= begin <= end"),
        ({"dtype": "F32", "shape": [2, 2], "data_offsets": [0, True]}, "data_offsets must be"),
        ({"shape": [2, 2], "data_offsets": [0, 16]}, "dtype must be a string"),
        ({"dtype": "F32", "shape": "2x2", "data_offsets": [0, 16]}, "shape must be a list"),
        ("F32", "not a JSON object"),
    ],
)
def test_a_bad_safetensors_header_entry_names_the_file_and_tensor(tmp_path, entry, needle):
    path = _with_header_entry(tmp_path, entry)
    with pytest.raises(ModelLoadError) as e:
        list(iter_safetensors(tmp_path))
    assert str(e.value).startswith(f"{path}: corrupt safetensors header (tensor 'w': ") and needle in str(e.value)


def _model_config(**overrides) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        **overrides,
    }


@pytest.mark.parametrize("archs", [5, "LlamaForCausalLM", [5], {"a": 1}])
def test_architectures_must_be_a_list_of_strings(tmp_path, archs):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_model_config(architectures=archs)))
    with pytest.raises(ModelLoadError, match="architectures must be a list of strings") as e:  # 5 was a TypeError
        ModelConfig.from_file(path)
    assert str(e.value).startswith(str(path))
    path.write_text(json.dumps(_model_config()))
    assert ModelConfig.from_file(path).architecture == "LlamaForCausalLM"


def test_a_config_json_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"architectures": ["\xff"]}')
    with pytest.raises(ModelLoadError, match="not UTF-8 text") as e:
        ModelConfig.from_file(path)
    assert str(e.value).startswith(str(path))


@pytest.fixture
def tok_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copy(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    return tmp_path


@pytest.mark.parametrize("template", [5, [5], [{"name": "default"}], [{"name": 1, "template": "x"}], {"a": "b"}])
def test_a_chat_template_of_the_wrong_type_fails_at_load(tok_dir, template):
    cfg = tok_dir / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": template}))
    with pytest.raises(ModelLoadError, match="chat_template must be a string or a list of") as e:
        Tokenizer.from_dir(tok_dir)  # 5 was a TypeError when the first chat request rendered it
    assert str(e.value).startswith(str(cfg))


def test_chat_template_files_that_load(tok_dir):
    cfg = tok_dir / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": [{"name": "default", "template": "D"}]}))
    assert Tokenizer.from_dir(tok_dir).apply_chat_template([]) == "D"
    cfg.write_text(json.dumps({"chat_template": None}))
    assert not Tokenizer.from_dir(tok_dir).has_chat_template


def test_a_chat_template_file_that_is_not_utf8_is_named(tok_dir):
    path = tok_dir / "chat_template.jinja"
    path.write_bytes(b"\xff{{ messages }}")
    with pytest.raises(ModelLoadError, match="not UTF-8 text") as e:
        Tokenizer.from_dir(tok_dir)
    assert str(e.value).startswith(str(path))
