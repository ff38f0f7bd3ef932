"""The router compiles a request's constraint and its tools' parameter schemas before queuing it:
what does not compile is a 400 (RouterError INVALID_REQUEST) naming the field; what does is cached."""

import asyncio
import json

import pytest

from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from engine.structured.constraint import ConstraintKind, StructuredOutput
from router.api import ErrorKind, RouterError
from router.grammar_check import GrammarCheck
from router.tool_calls.constraint import FunctionTool


@pytest.fixture(scope="module")
def check(tiny_model_dir):
    return GrammarCheck(Tokenizer.from_dir(tiny_model_dir), 512)


def _refused(check, sampling, tools=()):
    with pytest.raises(RouterError) as e:
        asyncio.run(check.check(sampling, tools))
    assert e.value.kind is ErrorKind.INVALID_REQUEST
    return e.value


@pytest.mark.parametrize(
    ("c", "field"),
    [
        (StructuredOutput(ConstraintKind.REGEX, "(a|b", "guided_regex"), "guided_regex"),
        (
            StructuredOutput.json_schema({"type": "bogus"}, "response_format.json_schema.schema"),
            "response_format.json_schema.schema",
        ),
        (StructuredOutput(ConstraintKind.GRAMMAR, "start: undefined_rule", "guided_grammar"), "guided_grammar"),
    ],
)
def test_uncompilable_constraint_is_a_400_naming_it(check, c, field):
    assert _refused(check, SamplingParams(structured=c)).param == field


def test_malformed_tool_parameters_are_a_400_naming_them(check):
    tools = [FunctionTool("ok", json.dumps({"type": "object"})), FunctionTool("bad", json.dumps({"type": 5}))]
    assert _refused(check, SamplingParams(), tools).param == "tools.[1].function.parameters"


def test_valid_constraints_compile_once(check):
    c = StructuredOutput.json_schema({"type": "object", "properties": {"a": {"enum": [1, 2]}}})
    asyncio.run(check.check(SamplingParams(structured=c)))
    n = len(check._compiler)
    asyncio.run(check.check(SamplingParams(structured=c)))
    assert len(check._compiler) == n
    asyncio.run(check.check(SamplingParams()))  # no constraint: nothing to do
