"""Property-based fuzzing of the HTTP API from its own published schema (``/openapi.json``, through
schemathesis): requests generated to the schema and mutated out of it, for every operation, against
the real app in front of a real router and engine (the tiny model, tests/router/http/engine_stack.py).

Each answer must be: no 5xx; a status the schema documents for the operation; a body that conforms
to the documented schema for that status (so every error is an OpenAI error object, every 200 the
published response model); a stream's every event a documented chunk or error object, ended by
``[DONE]``. The server must still answer afterwards. Bounded (150 examples per operation and mode,
about 1,300 requests, no deadline: seconds, not minutes, in the suite); more are a local run away
(``BATON_FUZZ_EXAMPLES=600``, and ``BATON_FUZZ_COVERAGE=1`` for schemathesis' boundary cases).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict

import httpx
import jsonschema
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from router.http.openapi import openapi_document
from tests.router.http.engine_stack import MODEL_NAME

EXAMPLES = int(os.environ.get("BATON_FUZZ_EXAMPLES", "150"))
DOCUMENT = openapi_document("Baton", "test", MODEL_NAME)
schema = schemathesis.openapi.from_dict(DOCUMENT)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=EXAMPLES)
# Explicit examples (none are published) and fuzzing; the coverage phase's hundreds of boundary
# cases per operation cost minutes on a small machine: BATON_FUZZ_COVERAGE=1 adds them.
schema.config.phases.update(
    phases=["examples", "fuzzing", *(["coverage"] if os.environ.get("BATON_FUZZ_COVERAGE") == "1" else [])]
)
SEEN: dict[str, Counter[int]] = defaultdict(Counter)  # operation -> statuses answered
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _validator(ref: dict[str, object]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**ref, "components": DOCUMENT["components"]})


def check_events(case, body: str) -> None:
    """Every event of a stream is a documented chunk or an error object; the last is [DONE]."""
    event = DOCUMENT["paths"][case.path][case.method.lower()]["responses"]["200"]["content"]["text/event-stream"]
    payload = _validator(event["schema"]["properties"]["data"]["anyOf"][1]["contentSchema"])
    events = [e.removeprefix("data: ") for e in body.split("\n\n") if e]
    assert events and events[-1] == "[DONE]", body[-500:]
    for raw in events[:-1]:
        payload.validate(json.loads(raw))


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation_answers_as_documented(case, engine_url):
    response = case.call(base_url=engine_url, timeout=60)
    SEEN[f"{case.method} {case.path}"][response.status_code] += 1
    case.validate_response(response, checks=CHECKS)
    if any(v.startswith("text/event-stream") for v in response.headers.get("content-type", [])):
        check_events(case, response.text)
    elif response.status_code == 200 and case.path.endswith("completions") and isinstance(case.body, dict):
        # Answered whole: the same request streamed (generated bodies rarely ask for a stream).
        body = {**case.body, "stream": True, "stream_options": {"include_usage": True}}
        streamed = httpx.post(engine_url + case.path, json=body, headers=case.headers, timeout=60)
        SEEN[f"{case.method} {case.path} stream"][streamed.status_code] += 1
        assert streamed.status_code == 200 or (body.get("echo") and body.get("max_tokens") == 0), streamed.text
        if streamed.status_code == 200:
            check_events(case, streamed.text)


def test_the_fuzzing_reached_the_engine():
    """Not only refusals: valid requests were generated and answered for each generation endpoint."""
    print("requests by operation and status:", {op: dict(statuses) for op, statuses in SEEN.items()})  # (-s)
    for op in ("POST /v1/completions", "POST /v1/chat/completions"):
        assert SEEN[f"{op} stream"][200] > 0, dict(SEEN)
        assert SEEN[op][200] > 0 and sum(n for status, n in SEEN[op].items() if 400 <= status < 500) > 0, dict(SEEN)


def test_the_server_still_serves_after_the_fuzzing(engine_url):
    assert httpx.get(engine_url + "/health").json() == {"status": "ok"}
    r = httpx.post(
        engine_url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "temperature": 0}, timeout=30
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
