"""Tokenizer: ids, decoding and chat templates equal transformers' AutoTokenizer; file errors."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import InvalidParameterError, ModelLoadError
from engine.model.registry import default_gguf_path
from engine.model.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "Hello, world! How are you?",
    " leading space",
    "trailing space ",
    "",
    " ",
    "   ",
    "\n",
    "\n\n\n",
    "\t\ttabs\tand  double  spaces",
    "a  b   c    d     e",
    "line one\nline two\r\nline three\n\n  indented",
    "12345 6789.01 3,141,592 0x1F 1e-10 -42 +7 100%",
    "x1y22z333 ab12cd",
    "naïve café résumé façade Ünïcödé",
    "日本語のテキスト、中文文本。한국어",
    "Привет мир",
    "مرحبا بالعالم",
    "😀 👍🏽 🇫🇷 👨‍👩‍👧‍👦 ❤️ 🚀🚀🚀",
    "mixed 日本 and emoji🎉end",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n    pass\n",
    'print("hello")\nfor (int i = 0; i < n; ++i) { sum += a[i]; }',
    "don't I'm we'll they've she's it'd DON'T",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<repo_name>x<file_sep>",
    "<|im_start|",
    "<s></s><unk>",
    "Ġ Ċ âĢ",
    "\u200b zero width \ufeff bom",
    "\x00\x01 control \x7f",
]


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcXYZ 0129\n\t.,!?'\"()<|>_-/\\éüß日本語😀🎉👍🏽"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 50))) for _ in range(n)]


CONVERSATIONS: list[list[dict[str, str | None]]] = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi, how can I help?"},
        {"role": "user", "content": "Tell me a joke 😀 about 日本"},
    ],
    [
        {"role": "system", "content": "Be helpful.\nAlways."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "  spaces  "},
        {"role": "assistant", "content": "ok", "name": None},
    ],
]


def _assert_matches_hf(ours: Tokenizer, hf, texts: list[str]) -> None:
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"], text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text


def _assert_chat_matches_hf(ours: Tokenizer, hf) -> None:
    for conv in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            expected = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
            assert ours.apply_chat_template(conv, add_generation_prompt=add_generation_prompt) == expected
            expected_ids = hf.apply_chat_template(
                conv, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt
            )
            assert ours.encode_chat(conv, add_generation_prompt=add_generation_prompt) == list(expected_ids)


# ---- the default model (SmolLM2 GGUF): against transformers' own GGUF tokenizer ------------------


@pytest.fixture(scope="module")
def hf_gguf_tokenizer():
    from transformers import AutoTokenizer

    gguf = default_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.mark.slow
def test_default_encode_decode_equals_transformers_gguf(default_model_dir: Path, hf_gguf_tokenizer) -> None:
    _assert_matches_hf(Tokenizer.from_dir(default_model_dir), hf_gguf_tokenizer, TEXTS + _random_texts(300))


@pytest.mark.slow
def test_default_imported_dir_equals_transformers(default_model_dir: Path, hf_gguf_tokenizer) -> None:
    """transformers loading our imported directory agrees with transformers loading the GGUF."""
    from transformers import AutoTokenizer

    hf_dir = AutoTokenizer.from_pretrained(default_model_dir)
    for text in TEXTS + _random_texts(100, seed=1):
        assert hf_dir(text)["input_ids"] == hf_gguf_tokenizer(text)["input_ids"], text
    _assert_matches_hf(Tokenizer.from_dir(default_model_dir), hf_dir, TEXTS)
    _assert_chat_matches_hf(Tokenizer.from_dir(default_model_dir), hf_dir)


@pytest.mark.slow
def test_default_chat_template_equals_transformers(default_model_dir: Path, hf_gguf_tokenizer) -> None:
    _assert_chat_matches_hf(Tokenizer.from_dir(default_model_dir), hf_gguf_tokenizer)


@pytest.mark.slow
def test_default_special_ids(default_model_dir: Path, hf_gguf_tokenizer) -> None:
    tok = Tokenizer.from_dir(default_model_dir)
    assert tok.bos_token_id == hf_gguf_tokenizer.bos_token_id == 1
    assert tok.eos_token_ids == (hf_gguf_tokenizer.eos_token_id,) == (2,)
    assert tok.vocab_size == len(hf_gguf_tokenizer) == 49152
    assert tok.id_to_token(1) == "<|im_start|>"
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [1]


# ---- the tiny model: against AutoTokenizer on the same directory --------------------------------


def test_tiny_equals_transformers(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = Tokenizer.from_dir(tiny_model_dir)
    _assert_matches_hf(ours, hf, TEXTS + _random_texts(100, seed=2))
    _assert_chat_matches_hf(ours, hf)
    assert ours.encode("hi")[0] == ours.bos_token_id == 1  # add_bos_token
    assert ours.eos_token_ids == (2,)


# ---- file handling and template environment ----------------------------------------------------


@pytest.fixture
def tok_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    shutil.copy(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    return tmp_path


def _write_config(d: Path, **cfg) -> None:
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", **cfg}))


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json: not found"):
        Tokenizer.from_dir(tmp_path)


def test_invalid_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json: invalid tokenizer file"):
        Tokenizer.from_dir(tmp_path)


def test_invalid_tokenizer_config(tok_dir: Path) -> None:
    (tok_dir / "tokenizer_config.json").write_text("{bad json")
    with pytest.raises(ModelLoadError, match=r"tokenizer_config\.json: invalid JSON"):
        Tokenizer.from_dir(tok_dir)


def test_eos_union_with_generation_config(tok_dir: Path) -> None:
    _write_config(tok_dir)
    (tok_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 9]}))
    assert Tokenizer.from_dir(tok_dir).eos_token_ids == (2, 7, 9)
    (tok_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert Tokenizer.from_dir(tok_dir).eos_token_ids == (2, 5)


def test_add_bos_and_eos_flags(tok_dir: Path) -> None:
    _write_config(tok_dir, add_bos_token=False, add_eos_token=True)
    tok = Tokenizer.from_dir(tok_dir)
    assert tok.encode("hi")[-1] == 2 and tok.encode("hi")[0] != 1
    assert tok.encode("hi", add_special_tokens=False)[-1] != 2


def test_no_chat_template(tok_dir: Path) -> None:
    _write_config(tok_dir)
    tok = Tokenizer.from_dir(tok_dir)
    assert not tok.has_chat_template
    with pytest.raises(InvalidParameterError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_environment(tok_dir: Path) -> None:
    template = (
        "{% if messages[0]['role'] == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}"
        "{% for m in messages %}{{ m | tojson }}{% endfor %}"
        "  {{ bos_token }}|{{ eos_token }}|{{ extra }}|{{ strftime_now('%Y') | length }}\n"
        "{% generation %}gen{% endgeneration %}"
        "{% for i in range(3) %}{% if i == 1 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    )
    _write_config(tok_dir, chat_template=template)
    tok = Tokenizer.from_dir(tok_dir)
    out = tok.apply_chat_template([{"role": "user", "content": "<b>é</b>"}], extra="X")
    assert out == '{"role": "user", "content": "<b>é</b>"}  <s>|</s>|X|4\ngen0'
    with pytest.raises(InvalidParameterError, match="roles must alternate"):
        tok.apply_chat_template([{"role": "bad", "content": ""}])
    with pytest.raises(Exception, match=r"unsafe|access"):  # sandboxed
        _write_config(tok_dir, chat_template="{{ messages.__class__.__mro__ }}")
        Tokenizer.from_dir(tok_dir).apply_chat_template([{"role": "user", "content": ""}])


def test_trim_and_lstrip_blocks_match_transformers(tok_dir: Path) -> None:
    from transformers import AutoTokenizer

    template = (
        "{% for m in messages %}\n    {% if m['role'] == 'user' %}\n[{{ m['content'] }}]\n    {% endif %}\n{% endfor %}"
    )
    _write_config(tok_dir, chat_template=template, tokenizer_class="PreTrainedTokenizerFast")
    conv = CONVERSATIONS[2]
    expected = AutoTokenizer.from_pretrained(tok_dir).apply_chat_template(conv, tokenize=False)
    assert Tokenizer.from_dir(tok_dir).apply_chat_template(conv, add_generation_prompt=False) == expected


def test_template_sources(tok_dir: Path) -> None:
    _write_config(tok_dir, chat_template=[{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}])
    tok = Tokenizer.from_dir(tok_dir)
    assert tok.apply_chat_template([]) == "D"
    assert tok.apply_chat_template([], tools=[{"name": "f"}]) == "T"
    (tok_dir / "chat_template.jinja").write_text("FILE {{ messages | length }}")
    assert Tokenizer.from_dir(tok_dir).apply_chat_template([{"role": "user", "content": ""}]) == "FILE 1"


def test_invalid_template_syntax(tok_dir: Path) -> None:
    _write_config(tok_dir, chat_template="{% for m in messages %}")
    with pytest.raises(ModelLoadError, match="invalid chat template"):
        Tokenizer.from_dir(tok_dir).apply_chat_template([{"role": "user", "content": ""}])


def test_importable_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import engine.model.tokenizer as t\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None and m.split('.')[0] == 'torch']\n"
    )
    root = Path(__file__).resolve().parents[3]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


# ---- token bytes (what logprobs name tokens by) ----------------------------------------------------


def test_token_bytes_concatenate_to_the_text(tiny_model_dir: Path) -> None:
    """Byte-level BPE: a token's bytes are exact, even for a token holding part of a character."""
    tok = Tokenizer.from_dir(tiny_model_dir)
    for text in TEXTS + _random_texts(50, seed=3):
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode(), text
    assert tok.token_bytes(10**9) == b""  # not in the vocabulary


def test_token_bytes_of_sentencepiece_pieces() -> None:
    """Byte-fallback ``<0xHH>`` pieces are their byte; ``▁`` is a space."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models

    vocab = {"<unk>": 0, "▁Hello": 1, "<0xE2>": 2, "world": 3}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback()])
    tok = Tokenizer(backend, special_tokens={}, chat_template=None)
    assert [tok.token_bytes(i) for i in range(4)] == [b"<unk>", b" Hello", b"\xe2", b"world"]
