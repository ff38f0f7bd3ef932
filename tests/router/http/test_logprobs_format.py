"""``LogprobsFormatter`` alone: completions' ``text_offset`` with ``echo`` when the prompt's tokens do
not spell the prompt's text exactly (a BOS the tokenizer added, sentencepiece's leading space)."""

from __future__ import annotations

from engine.logprobs import TokenLogprob
from router.http.logprobs import LogprobsFormatter

PIECES = {1: b"<s>", 10: b" Hello", 11: b" world", 12: b"!", 20: b" Bye", 30: "é".encode()[:1], 31: "é".encode()[1:]}


def token_bytes(ids):
    return [PIECES[t] for t in ids]


def lp(token_id: int, value: float | None = -1.0) -> TokenLogprob:
    return TokenLogprob(token_id, value, ())


def offsets(formatted: dict) -> list[int]:
    return formatted["text_offset"]


def test_echoed_prompt_with_bos_and_a_leading_space_indexes_the_returned_text():
    echo = "Hello world!"
    f = LogprobsFormatter(token_bytes, chat=False, echo_text=echo)
    out = f.format([lp(20)], prompt=[lp(1, None), lp(10), lp(11), lp(12)])
    assert out["tokens"] == ["<s>", " Hello", " world", "!", " Bye"]
    # "<s>" and " Hello"'s space are not in the text: they start at 0; the rest index it exactly
    assert offsets(out) == [0, 0, 5, 11, 12]
    text = echo + " Bye"
    assert text[5:11] == " world" and text[11] == "!" and text[12:] == " Bye"
    assert offsets(f.format([lp(12)])) == [16]  # later chunks continue after the completion so far


def test_echo_of_a_prompt_its_tokens_spell_exactly_starts_at_zero():
    f = LogprobsFormatter(token_bytes, chat=False, echo_text=" Hello world")
    assert offsets(f.format([lp(12)], prompt=[lp(10, None), lp(11)])) == [0, 6, 12]


def test_a_character_split_over_two_prompt_tokens_counts_once():
    f = LogprobsFormatter(token_bytes, chat=False, echo_text="é!")
    assert offsets(f.format([], prompt=[lp(30, None), lp(31), lp(12)])) == [0, 0, 1]


def test_without_echo_offsets_start_at_the_completion():
    f = LogprobsFormatter(token_bytes, chat=False)
    assert offsets(f.format([lp(10), lp(11)])) == [0, 6]
    assert offsets(f.format([lp(12)])) == [12]
