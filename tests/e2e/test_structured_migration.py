"""A constrained (json_schema) streaming request whose decode worker is killed mid-stream (real Ray,
1 prefill + 2 decode workers, gloo): it migrates to the other decode worker, whose fresh matcher
replays the tokens already delivered, and finishes at the grammar's end with JSON valid against
its schema; every token is delivered once (the stream's pieces are the colocated engine's tokens
and text, none missing or repeated)."""

import json

import jsonschema
import pytest
import ray

from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.structured.constraint import StructuredOutput
from tests.e2e.helpers import engine_config, prompts, start_cluster

VOCAB = 4096
# A grammar that always ends, well past the first outputs: forty enum items.
SCHEMA = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 40, "maxItems": 40}
    },
    "required": ["tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def c12(ray_session, tiny_model_dir):
    c = start_cluster(tiny_model_dir, 1, 2, max_restarts=1)
    yield c
    c.shutdown()


def test_constrained_stream_migrates_and_finishes_valid(c12, tiny_model_dir):
    ps = prompts(31, 3, VOCAB, lo=20, hi=60)
    params = SamplingParams(max_tokens=400, structured=StructuredOutput.json_schema(SCHEMA))
    streams = [c12.submit(p, params) for p in ps]
    pieces = [iter(s) for s in streams]
    first = next(pieces[0])
    victim = c12.dispatcher.placement(first.request_id)[0]
    migrations = c12.dispatcher.num_migrations
    ray.kill(c12.actor(victim), no_restart=True)
    delivered = [[first], *[[] for _ in streams[1:]]]
    for got, it in zip(delivered, pieces):
        got.extend(it)  # (to the finished output)
    want = LLMEngine(engine_config(tiny_model_dir)).generate(ps, [params] * len(ps))
    assert c12.dispatcher.num_migrations > migrations
    assert len(first.new_token_ids) < len(streams[0].token_ids)  # (killed mid-stream)
    for got, s, ref in zip(delivered, streams, want):
        assert [t for o in got for t in o.new_token_ids] == ref.token_ids == s.token_ids
        assert "".join(o.text_delta for o in got) == ref.text == s.text
        assert s.finished and s.finish_reason == "stop"
        jsonschema.validate(json.loads(s.text), SCHEMA)
    c12.wait_until_drained()
