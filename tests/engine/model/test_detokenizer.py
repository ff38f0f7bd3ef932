"""Incremental detokenization: streamed deltas concatenate to ``decode()`` of everything generated,
and an incomplete UTF-8 sequence (emoji / CJK split across byte-level tokens) never leaks a U+FFFD."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.model.tokenizer import Tokenizer

SPLIT_TEXTS = [
    "😀👍🏽🇫🇷 family: 👨‍👩‍👧‍👦!",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "naïve café — “quotes” … €100",
    "Hello world, this is plain ASCII with  double spaces\nand newlines\n\n",
    "mixed 日本 and emoji🎉end <|im_start|> special",
]


@pytest.fixture(scope="module")
def tiny_tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def default_tok(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(default_model_dir)


def _stream(
    tok: Tokenizer, prompt: list[int], ids: list[int], chunks: list[int], skip: bool = True
) -> tuple[list[str], str]:
    """Feed ``ids`` in chunks of the given sizes; return the deltas and the final flush."""
    detok = tok.new_detokenizer(prompt, skip_special_tokens=skip)
    deltas, i, k = [], 0, 0
    while i < len(ids):
        n = chunks[k % len(chunks)] if chunks else 1
        deltas.append(detok.add(ids[i : i + n]))
        i, k = i + n, k + 1
        assert tok.decode(ids, skip_special_tokens=skip).startswith(detok.text)  # never emits what it must retract
    tail = detok.finish()
    assert detok.text == "".join(deltas) + tail
    return deltas, tail


def _check_valid_text(tok: Tokenizer, text: str, prompt_text: str = "User says: ") -> None:
    """Ids from real text: every delta is clean and nothing is left for ``finish``."""
    prompt = tok.encode(prompt_text)
    ids = tok.encode(text, add_special_tokens=False)
    for chunks in ([1], [2, 3], [len(ids) or 1]):
        deltas, tail = _stream(tok, prompt, ids, chunks)
        assert "".join(deltas) == tok.decode(ids)
        assert tail == ""
        assert not any("\ufffd" in d for d in deltas)


def _check_random_ids(tok: Tokenizer, rng: random.Random, n: int = 60) -> None:
    ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, n))]
    prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 8))]
    chunks = [rng.randint(1, 4) for _ in range(3)]
    for skip in (True, False):
        deltas, tail = _stream(tok, prompt, ids, chunks, skip)
        assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=skip)


def test_split_multibyte_characters_tiny(tiny_tok: Tokenizer) -> None:
    # The tiny vocabulary has few merges for non-ASCII text, so most characters span several tokens.
    multi = [t for t in SPLIT_TEXTS if len(tiny_tok.encode(t, add_special_tokens=False)) > len(t.encode()) // 3]
    assert multi
    for text in SPLIT_TEXTS:
        _check_valid_text(tiny_tok, text)


def test_partial_character_is_held_back(tiny_tok: Tokenizer) -> None:
    ids = tiny_tok.encode("😀", add_special_tokens=False)
    assert len(ids) > 1  # one emoji, several byte tokens
    detok = tiny_tok.new_detokenizer([])
    assert [detok.add([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.add(ids[-1:]) == "😀"


def test_finish_flushes_incomplete_tail(tiny_tok: Tokenizer) -> None:
    ids = tiny_tok.encode("ok 😀", add_special_tokens=False)[:-1]  # cut the emoji short
    detok = tiny_tok.new_detokenizer([1])
    text = detok.add(ids)
    assert "\ufffd" not in text
    assert text + detok.finish() == tiny_tok.decode(ids)
    assert tiny_tok.decode(ids).endswith("\ufffd")


def test_special_tokens(tiny_tok: Tokenizer) -> None:
    ids = tiny_tok.encode("a</s>b", add_special_tokens=False)
    assert 2 in ids
    assert "".join(_stream(tiny_tok, [1], ids, [1], skip=True)[0]) == "ab"
    assert "".join(_stream(tiny_tok, [1], ids, [1], skip=False)[0]) == "a</s>b"


def test_random_ids_tiny(tiny_tok: Tokenizer) -> None:
    rng = random.Random(0)
    for _ in range(300):
        _check_random_ids(tiny_tok, rng)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40))
def test_hypothesis_text_tiny(tiny_tok: Tokenizer, text: str) -> None:
    _check_valid_text(tiny_tok, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(st.integers(0, 4095), max_size=40),
    prompt=st.lists(st.integers(0, 4095), max_size=6),
    chunk=st.integers(1, 5),
)
def test_hypothesis_ids_tiny(tiny_tok: Tokenizer, ids: list[int], prompt: list[int], chunk: int) -> None:
    deltas, tail = _stream(tiny_tok, prompt, ids, [chunk])
    assert "".join(deltas) + tail == tiny_tok.decode(ids)


@pytest.mark.slow
def test_default_model_streaming(default_tok: Tokenizer) -> None:
    for text in SPLIT_TEXTS:
        _check_valid_text(default_tok, text, prompt_text="<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    rng = random.Random(1)
    for _ in range(300):
        _check_random_ids(default_tok, rng)


def test_a_long_run_of_stray_bytes_streams_out_and_keeps_the_window_small(tiny_tok: Tokenizer) -> None:
    """A model emitting continuation bytes (no UTF-8 at all) kept every token held: each new token
    re-decoded the whole run (268 µs a token after 4,000, on every step of its batch)."""
    stray = next(t for t in range(tiny_tok.vocab_size) if tiny_tok.token_bytes(t) == b"\x80")
    euro = tiny_tok.encode(" 5 €, ok", add_special_tokens=False)
    ids = [stray] * 300 + euro + [stray] * 30 + tiny_tok.encode("😀 done", add_special_tokens=False)
    detok = tiny_tok.new_detokenizer(tiny_tok.encode("prompt"))
    deltas, longest = [], 0
    for i in ids:
        deltas.append(detok.add([i]))
        longest = max(longest, len(detok._ids))
        assert tiny_tok.decode(ids).startswith(detok.text)  # nothing emitted is taken back
    assert "".join(deltas) + detok.finish() == tiny_tok.decode(ids)
    assert longest <= 16  # was 300+: the whole run held
    assert sum(1 for d in deltas if d) > 30  # it streams, not one delta at the end
    for chunks in ([3], [1, 7]):  # fed several at a time too
        d, tail = _stream(tiny_tok, [1], ids, chunks)
        assert "".join(d) + tail == tiny_tok.decode(ids)
