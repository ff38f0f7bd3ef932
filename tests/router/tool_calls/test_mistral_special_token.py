"""Mistral's ``[TOOL_CALLS]`` is a special token: text decoded without special tokens (the default)
drops it and the parser sees no call. A request read for tool calls in that format keeps special
tokens in its text, so the call is found -- whole and streamed token by token through the engine's
own detokenizer -- while other formats' requests keep the default."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer

from engine.model.registry import resolve_model
from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from engine.structured.compiler import GrammarCompiler
from engine.structured.control_tokens import resolve_control_tokens
from router.tool_calls.constraint import FunctionTool, tool_call_constraint
from router.tool_calls.parsers import ToolFormat, keep_markup, parse
from router.tool_calls.streaming import ToolCallDelta, ToolCallStream

RAW = 'Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'


@pytest.fixture(scope="module")
def mistral_like() -> Tokenizer:
    """The default model's tokenizer with ``[TOOL_CALLS]`` added as a special token."""
    backend = HFTokenizer.from_file(str(resolve_model("default") / "tokenizer.json"))
    assert backend.add_special_tokens(["[TOOL_CALLS]"]) == 1
    return Tokenizer(backend, special_tokens={}, chat_template=None)


def _ids(tok: Tokenizer) -> list[int]:
    ids = tok.encode(RAW, add_special_tokens=False)
    special = tok.token_to_id("[TOOL_CALLS]")
    assert special is not None and ids.count(special) == 1  # (one token, not its spelling)
    return ids


def _streamed(tok: Tokenizer, sampling: SamplingParams) -> tuple[str, list[ToolCallDelta]]:
    """The text the engine's detokenizer streams token by token, and the calls streaming finds in it."""
    detok = tok.new_detokenizer([1, 2, 3], skip_special_tokens=sampling.skip_special_tokens)
    stream = ToolCallStream(ToolFormat.MISTRAL, lambda: "call_0")
    deltas: list[ToolCallDelta] = []
    for i in _ids(tok):
        deltas += stream.feed(detok.add([i])).tool_calls
    deltas += stream.finish().tool_calls
    return detok.text, deltas


def test_the_default_drops_the_marker(mistral_like):
    text, deltas = _streamed(mistral_like, SamplingParams())
    assert "[TOOL_CALLS]" not in text and deltas == []
    assert parse(ToolFormat.MISTRAL, text, lambda: "c")[1] == []


def test_mistral_requests_keep_it_and_the_call_is_found(mistral_like):
    sampling = keep_markup(ToolFormat.MISTRAL, SamplingParams(max_tokens=9, temperature=0.5))
    assert not sampling.skip_special_tokens and sampling.max_tokens == 9 and sampling.temperature == 0.5
    text, deltas = _streamed(mistral_like, sampling)
    assert text == RAW
    content, calls = parse(ToolFormat.MISTRAL, text, lambda: "c")
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert [d.name for d in deltas if d.name] == ["get_weather"]
    assert json.loads("".join(d.arguments or "" for d in deltas)) == {"city": "Paris"}


@pytest.mark.parametrize("fmt", [ToolFormat.HERMES, ToolFormat.LLAMA3_JSON])
def test_other_formats_keep_the_default(fmt):
    sampling = SamplingParams()
    assert keep_markup(fmt, sampling) is sampling


# -- the forced call's grammar (tool_choice required / named) ------------------------------------
TOOL = FunctionTool("get_weather", json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}))
CALL = '[{"name":"get_weather","arguments":{"city":"Paris"}}]'


def _compiler(tok: Tokenizer) -> GrammarCompiler:
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None
    return GrammarCompiler(tok.backend.to_str(), tok.vocab_size, [eos])


def test_forced_call_takes_the_special_token(mistral_like):
    """The model can emit the real control token (and must: its spelling in ordinary tokens is
    refused); the call after it is the grammar's, to its end."""
    constraint = tool_call_constraint(ToolFormat.MISTRAL, [TOOL], parallel=False)
    compiler = _compiler(mistral_like)
    marker = mistral_like.token_to_id("[TOOL_CALLS]")
    m = compiler.matcher(constraint)
    assert m.consume_tokens([marker, *mistral_like.encode(CALL, add_special_tokens=False)]), m.get_error()
    assert m.is_accepting()
    spelled = compiler.matcher(constraint)
    first = mistral_like.token_to_id("[")
    assert first is not None and not spelled.consume_tokens([first])


def test_without_the_token_the_marker_is_spelled():
    """A tokenizer without ``[TOOL_CALLS]`` (the default model's): the grammar takes its spelling."""
    tok = Tokenizer(
        HFTokenizer.from_file(str(resolve_model("default") / "tokenizer.json")), special_tokens={}, chat_template=None
    )
    m = _compiler(tok).matcher(tool_call_constraint(ToolFormat.MISTRAL, [TOOL], parallel=True))
    assert m.consume_tokens(tok.encode("[TOOL_CALLS]" + CALL, add_special_tokens=False)), m.get_error()
    assert m.is_accepting()


def test_only_bracketed_names_outside_literals_are_resolved(mistral_like):
    llt = _compiler(mistral_like).tokenizer
    marker = mistral_like.token_to_id("[TOOL_CALLS]")
    grammar = 'start: <[TOOL_CALLS]> "<[TOOL_CALLS]>" /<[TOOL_CALLS]>/ <[INST]> <[5]> <[^7]>'
    assert resolve_control_tokens(grammar, llt) == (
        f'start: <[{marker}]> "<[TOOL_CALLS]>" /<[TOOL_CALLS]>/ "[INST]" <[5]> <[^7]>'
    )
