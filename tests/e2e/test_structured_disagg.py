"""Structured outputs through one prefill and one decode worker (Ray actors, KV over gloo): the
first token is sampled under the grammar's mask on the prefill worker, the decode worker's matcher
replays it and constrains the rest; the tokens equal the colocated engine's and the outputs
validate against their schemas."""

import json

import jsonschema
import pytest

from bench.grammar_backends import SCHEMAS
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.structured.constraint import StructuredOutput
from tests.e2e.helpers import engine_config, prompts, start_cluster

VOCAB = 4096


@pytest.fixture(scope="module")
def c11(ray_session, tiny_model_dir):
    c = start_cluster(tiny_model_dir, 1, 1, local_prefill_threshold=24, short_prompts_to_idle_prefill=False)
    yield c
    c.shutdown()


def test_schemas_through_prefill_and_decode_pools(c11, tiny_model_dir):
    schemas = [SCHEMAS[name][0] for name in ("enum", "array", "flat", "enum")]
    ps = prompts(21, len(schemas), VOCAB, lo=40, hi=80)  # past the local-prefill threshold: disaggregated
    params = [SamplingParams(max_tokens=48, structured=StructuredOutput.json_schema(s)) for s in schemas]
    disagg = c11.dispatcher.num_disaggregated
    outs = c11.generate(ps, params)
    assert c11.dispatcher.num_disaggregated == disagg + len(ps)
    local = LLMEngine(engine_config(tiny_model_dir)).generate(ps, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in local]
    finished = 0
    for out, schema in zip(outs, schemas):
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)
            finished += 1
    assert finished >= 2  # (a random model may write a string up to max_tokens)
    c11.wait_until_drained()
