"""``GET /openapi.json``: a valid OpenAPI 3.1 document that describes every route the app serves, with
its request and response models, its streaming responses and its errors (router/http/openapi.py).
That the described models are the served ones is checked by the fuzzer (test_http_fuzz.py) and the
conformance tests; here, that nothing the app serves is missing from the document."""

from __future__ import annotations

import re

import httpx
from openapi_spec_validator import validate
from starlette.routing import Route

from router.http import response_models as rm
from router.http.app import create_app
from router.http.openapi import ROUTES, openapi_document
from router.http.schemas import ChatCompletionRequest, CompletionRequest
from tests.router.fake_router import FakeRouter
from tests.router.http.conftest import MODEL

ERROR_REF = "#/components/schemas/ErrorResponse"
EXTENSIONS = {
    "lane",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
}


def served_routes() -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves, but the document's own."""
    app = create_app(FakeRouter(), served_model_name=MODEL)
    out = set()
    for route in app.routes:
        assert isinstance(route, Route)
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # "{model_id:path}" -> "{model_id}"
        if path == "/openapi.json":
            continue
        out |= {(m.lower(), path) for m in route.methods or () if m != "HEAD"}
    return out


def test_the_document_is_served_and_valid_openapi_3_1(url):
    r = httpx.get(url + "/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    validate(doc)
    assert doc["paths"] == openapi_document("Baton", doc["info"]["version"], MODEL)["paths"]
    [model_id] = doc["paths"]["/v1/models/{model_id}"]["get"]["parameters"]
    assert model_id["examples"]["served"]["value"] == MODEL


def test_every_route_is_described_and_nothing_else(url):
    doc = httpx.get(url + "/openapi.json").json()
    described = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert described == served_routes()
    assert described == {(r.method, r.path) for r in ROUTES}


def test_each_operation_has_its_models_and_its_errors(url):
    doc = httpx.get(url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for route in ROUTES:
        op = doc["paths"][route.path][route.method]
        ok = op["responses"]["200"]["content"]
        if route.ok is not None:
            name = ok["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            assert name == route.ok.__name__ and name in schemas
        if route.body is not None:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[1] == route.body.__name__
        for status in route.errors:
            assert op["responses"][str(status)]["content"]["application/json"]["schema"]["$ref"] == ERROR_REF
        if route.chunk is not None:  # streamed: each event's data a chunk or an error, or [DONE]
            data = ok["text/event-stream"]["schema"]["properties"]["data"]["anyOf"]
            assert {"const": "[DONE]"} in data
            refs = [s["$ref"] for s in data[1]["contentSchema"]["anyOf"]]
            assert refs == [f"#/components/schemas/{route.chunk.__name__}", ERROR_REF]
            assert {"400", "401", "404", "413", "429", "503"} <= set(op["responses"])


def test_request_models_publish_the_fields_baton_accepts():
    doc = openapi_document("Baton", "test")
    for model in (ChatCompletionRequest, CompletionRequest):
        published = doc["components"]["schemas"][model.__name__]["properties"]
        assert set(published) == set(model.model_fields)
        assert set(published) >= EXTENSIONS
        assert all(published[name].get("description") for name in EXTENSIONS), "extensions say what they do"
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["messages"]["minItems"] == 1 and chat["tools"]["anyOf"][0]["items"]["$ref"].endswith("/Tool")


def test_response_models_published_are_the_ones_served():
    doc = openapi_document("Baton", "test")
    for model in rm.RESPONSE_MODELS:
        assert model.__name__ in doc["components"]["schemas"], model
    message = doc["components"]["schemas"]["AssistantMessage"]
    assert "refusal" in message["required"]
    for name in ("ChatCompletion", "ChatCompletionChunk", "Completion", "CompletionChunk"):
        fingerprint = doc["components"]["schemas"][name]["properties"]["system_fingerprint"]
        assert fingerprint == {"title": "System Fingerprint", "type": "string"}
