"""Structured outputs in the engine: outputs validate against their JSON schema (jsonschema) on the
default model and tiny, with speculative decoding on and off (the same tokens), n = 3 seeded
choices, forced preemption (the matcher replays the recomputed tokens), ignore_eos (the grammar's end
still finishes the request), and a constraint that does not compile ends its request with an error."""

import json
import re

import jsonschema
import pytest

from bench.grammar_backends import SCHEMAS
from engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.structured.constraint import ConstraintKind, StructuredOutput

SPEC = SpeculativeConfig(num_tokens=4, min_keep_chance=0.0)


def _engine(model_dir, spec=None, **kw):
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            scheduler=SchedulerConfig(speculative=spec, **kw.pop("scheduler", {})),
            cache=CacheConfig(**kw.pop("cache", {})),
            **kw,
        )
    )


def _prompts(engine, n=4):  # (one per schema of SCHEMAS)
    return [
        engine.tokenizer.encode_chat([{"role": "user", "content": f"Describe item {i} as JSON."}]) for i in range(n)
    ]


def _params(schema, **kw):
    return SamplingParams(max_tokens=kw.pop("max_tokens", 96), structured=StructuredOutput.json_schema(schema), **kw)


@pytest.fixture(scope="module")
def default_engine(default_model_dir):
    return _engine(default_model_dir)


def _check(outs, schemas):
    for out, schema in zip(outs, schemas, strict=True):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)


def test_default_model_schemas_validate(default_engine):
    schemas = [s for s, _ in SCHEMAS.values()]
    outs = default_engine.generate(_prompts(default_engine), [_params(s) for s in schemas])
    _check(outs, schemas)
    assert default_engine.num_free_blocks == default_engine.num_total_blocks


def test_default_model_n3_seeded_and_reproducible(default_engine):
    schema = SCHEMAS["enum"][0]
    prompt = _prompts(default_engine, 1) * 3
    params = [_params(schema, temperature=1.0, seed=s, max_tokens=24) for s in (1, 2, 3)]
    first = default_engine.generate(prompt, params)
    _check(first, [schema] * 3)
    again = default_engine.generate(prompt, params)
    assert [o.token_ids for o in again] == [o.token_ids for o in first]  # seeded sampling stays reproducible


def test_grammar_end_finishes_with_ignore_eos(default_engine):
    c = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")
    out = default_engine.generate(
        _prompts(default_engine, 1), [SamplingParams(max_tokens=50, structured=c, ignore_eos=True)]
    )[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_regex_and_json_object(default_engine):
    regex = StructuredOutput(ConstraintKind.REGEX, r"[A-Z][a-z]{2,6} [0-9]{3}", "guided_regex")
    obj = StructuredOutput(ConstraintKind.JSON_OBJECT)
    a, b = default_engine.generate(
        _prompts(default_engine, 2),
        [SamplingParams(max_tokens=40, structured=regex), SamplingParams(max_tokens=40, structured=obj)],
    )
    assert re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{3}", a.text)
    assert b.text.startswith("{")  # (free-form JSON may run to max_tokens: then a prefix of an object)
    if b.finish_reason == "stop":
        assert isinstance(json.loads(b.text), dict)


def test_compiled_once_per_schema(default_engine):
    compiler = default_engine.runner.grammars.compiler
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]}
    before = len(compiler)
    default_engine.generate(_prompts(default_engine, 3), [_params(schema, max_tokens=12)] * 3)
    assert len(compiler) == before + 1


def test_bad_constraint_ends_with_an_error(default_engine):
    """(Compiled off the engine thread: the request ends with an error naming the field, no block taken.)"""
    bad = [
        StructuredOutput(ConstraintKind.REGEX, "(a|b", "guided_regex"),
        StructuredOutput.json_schema({"type": "no-such-type"}, "response_format"),
    ]
    outs = default_engine.generate([[1, 2, 3]] * 2, [SamplingParams(structured=c) for c in bad])
    for out, c in zip(outs, bad):
        assert out.finish_reason == "error" and out.token_ids == [] and out.error.param == c.field
    assert default_engine.num_free_blocks == default_engine.num_total_blocks


def test_speculative_identical_tokens(default_model_dir, default_engine):
    schemas = [s for s, _ in SCHEMAS.values()]
    plain = default_engine.generate(_prompts(default_engine), [_params(s) for s in schemas])
    spec = _engine(default_model_dir, spec=SPEC)
    drafted = spec.generate(_prompts(spec), [_params(s) for s in schemas])
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    assert spec.scheduler.num_preemptions == 0


def test_tiny_with_preemption(tiny_model_dir):
    """A random model: the mask alone makes its output valid; a small cache forces preemptions (the
    recomputed request's matcher replays its tokens) and the outputs equal an unpreempted run's."""
    schemas = [SCHEMAS["enum"][0], SCHEMAS["array"][0], SCHEMAS["flat"][0]] * 2
    roomy = _engine(tiny_model_dir)
    prompts = [[5 + i, 7, 9, 11] for i in range(len(schemas))]
    params = [_params(s, max_tokens=60) for s in schemas]
    want = roomy.generate(prompts, params)
    tight = _engine(tiny_model_dir, cache={"block_size": 4, "num_blocks": 30}, scheduler={"admission_watermark": 0.0})
    got = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for out, schema in zip(got, schemas):
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)
    assert sum(o.finish_reason == "stop" for o in got) >= len(got) // 2
