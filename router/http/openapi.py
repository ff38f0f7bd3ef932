"""The published API description: ``GET /openapi.json`` (OpenAPI 3.1).

The endpoints parse their own bodies (router/http/body.py, for OpenAI's error objects), so FastAPI
cannot derive this from their signatures; it is assembled here from the models that do the work:
request bodies from router/http/schemas.py (what is actually validated), responses from
router/http/response_models.py (held to the served objects by the tests). ``ROUTES`` is the table
of every route the app serves; tests check that the app and the table agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from router.http import response_models as rm
from router.http.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from router.request_ids import MAX_REQUEST_ID_LEN

REF = "#/components/schemas/{model}"
GENERATION_ERRORS = (400, 401, 403, 404, 409, 413, 429, 500, 503, 504)
READ_ERRORS = (401, 500)
BODY_ERRORS = (400, 401, 404, 413, 500)  # the tokenizer endpoints: bad body, unknown model
_STATUS_TEXT = {
    400: "Invalid request: the error names the parameter at fault.",
    401: "A key is required and none (or an unknown one) was given.",
    403: "The tenant may not use the lane it asked for.",
    404: "Unknown model, job or request.",
    409: "An Idempotency-Key reused with a different request.",
    413: "The request body is over the server's limit.",
    429: "Rate limited or the lane's queue is full (see Retry-After).",
    500: "The server failed.",
    503: "Draining, overloaded, or a lane's latency target cannot be met (see Retry-After).",
    504: "The request's deadline passed.",
}
_STRING: dict[str, Any] = {"type": "string"}
_REQUEST_HEADERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("X-Baton-Lane", "The traffic-class lane (as the body's 'lane').", _STRING),
    ("Idempotency-Key", "Makes retries safe: a request sent again with the same key is answered once.", _STRING),
    (
        "X-Request-Id",
        "The request's id; names a durable batch job.",
        {"type": "string", "pattern": f"^[A-Za-z0-9._-]{{1,{MAX_REQUEST_ID_LEN}}}$"},
    ),
    ("traceparent", "W3C trace context.", _STRING),
)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    ok: type[BaseModel] | None  # the 200 body (None: not JSON; see ``ok_media``)
    errors: tuple[int, ...] = ()
    body: type[BaseModel] | None = None
    chunk: type[BaseModel] | None = None  # set where ``"stream": true`` answers text/event-stream
    ok_media: str = "application/json"
    authenticated: bool = True
    path_params: tuple[str, ...] = ()
    extra_responses: dict[int, type[BaseModel]] = field(default_factory=dict)


ROUTES: tuple[Route, ...] = (
    Route(
        "post",
        "/v1/completions",
        "Complete a prompt (OpenAI's legacy completions).",
        rm.Completion,
        GENERATION_ERRORS,
        CompletionRequest,
        rm.CompletionChunk,
    ),
    Route(
        "post",
        "/v1/chat/completions",
        "Answer a conversation (OpenAI's chat completions).",
        rm.ChatCompletion,
        GENERATION_ERRORS,
        ChatCompletionRequest,
        rm.ChatCompletionChunk,
    ),
    Route("get", "/v1/models", "The served model.", rm.ModelList, READ_ERRORS),
    Route("get", "/v1/models/{model_id}", "One model.", rm.Model, (*READ_ERRORS, 404), path_params=("model_id",)),
    Route(
        "get",
        "/v1/batches/{job_id}",
        "A durable batch-lane job's status and result.",
        rm.BatchJob,
        (*READ_ERRORS, 404, 503),
        path_params=("job_id",),
    ),
    Route(
        "post",
        "/v1/abort/{request_id}",
        "Stop one of the caller's in-flight requests (its X-Request-Id).",
        rm.Aborted,
        (*READ_ERRORS, 404),
        path_params=("request_id",),
    ),
    Route("post", "/tokenize", "Tokenize a prompt or messages (vLLM's).", rm.Tokenized, BODY_ERRORS, TokenizeRequest),
    Route("post", "/detokenize", "Token ids back to text (vLLM's).", rm.Detokenized, BODY_ERRORS, DetokenizeRequest),
    Route("get", "/health", "Liveness.", rm.Health, (500,), authenticated=False),
    Route(
        "get",
        "/ready",
        "Readiness (503 while starting or draining).",
        rm.Ready,
        (500,),
        authenticated=False,
        extra_responses={503: rm.Ready},
    ),
    Route("get", "/metrics", "Prometheus metrics.", None, (500,), ok_media="text/plain", authenticated=False),
)


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": ref}}


def _operation(route: Route, names: dict[tuple[Any, str], str], served_model: str | None) -> dict[str, Any]:
    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return {"$ref": REF.format(model=names[(model, mode)])}

    ok: dict[str, Any] = {"description": "OK"}
    if route.ok is not None:
        ok["content"] = _json(ref(route.ok, "serialization"))
    else:
        ok["content"] = {route.ok_media: {"schema": {"type": "string"}}}
    if route.chunk is not None:
        # Under OpenAPI 3.1 an event stream's schema describes one event: its "data" is a chunk or
        # an error object (as JSON text), or the "[DONE]" that ends the stream.
        payload = {"anyOf": [ref(route.chunk, "serialization"), ref(rm.ErrorResponse, "serialization")]}
        ok["content"]["text/event-stream"] = {
            "schema": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "data": {
                        "anyOf": [
                            {"const": "[DONE]"},
                            {"type": "string", "contentMediaType": "application/json", "contentSchema": payload},
                        ]
                    }
                },
                "description": f"One server-sent event: a {route.chunk.__name__} or an error; the last is [DONE].",
            }
        }
    responses: dict[str, Any] = {"200": ok}
    for status, model in route.extra_responses.items():
        responses[str(status)] = {"description": "Not ready", "content": _json(ref(model, "serialization"))}
    for status in route.errors:
        responses[str(status)] = {
            "description": _STATUS_TEXT[status],
            "content": _json(ref(rm.ErrorResponse, "serialization")),
        }
    op: dict[str, Any] = {"summary": route.summary, "operationId": _operation_id(route), "responses": responses}
    params: list[dict[str, Any]] = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in route.path_params
    ]
    for p in params:
        if p["name"] == "model_id" and served_model is not None:
            p["examples"] = {"served": {"value": served_model}}
    if route.chunk is not None:
        params += [
            {"name": h, "in": "header", "required": False, "description": d, "schema": schema}
            for h, d, schema in _REQUEST_HEADERS
        ]
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": True, "content": _json(ref(route.body, "validation"))}
    # Keys are required only where the server is configured with tenants' keys: either is valid.
    op["security"] = [{"bearer": []}, {}] if route.authenticated else []
    return op


def _operation_id(route: Route) -> str:
    words = [w.strip("{}") for w in route.path.split("/") if w and w != "v1"]
    return "_".join([route.method, *words])


def _reachable(root: object, defs: dict[str, Any]) -> dict[str, Any]:
    """The definitions ``root`` refers to, directly or through others (pydantic also emits the
    dataclasses behind fields whose published shape is given by ``json_schema_input_type``)."""
    prefix = REF.format(model="")
    seen: dict[str, Any] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(prefix) and ref[len(prefix) :] not in seen:
                name = ref[len(prefix) :]
                seen[name] = defs[name]
                stack.append(defs[name])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return dict(sorted(seen.items()))


def openapi_document(title: str, version: str, served_model: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the app ``router.http.app.create_app`` builds; ``served_model``, the
    served model's id, is given as the example of the requests that name one."""
    wanted: list[tuple[type[BaseModel], Any]] = []
    for route in ROUTES:
        for model, mode in ((route.body, "validation"), (route.ok, "serialization"), (route.chunk, "serialization")):
            if model is not None and (model, mode) not in wanted:
                wanted.append((model, mode))
        for model in route.extra_responses.values():
            if (model, "serialization") not in wanted:
                wanted.append((model, "serialization"))
    wanted.append((rm.ErrorResponse, "serialization"))
    keys, defs = models_json_schema(wanted, ref_template=REF)
    names: dict[tuple[Any, str], str] = {key: value["$ref"].rsplit("/", 1)[1] for key, value in keys.items()}
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(route, names, served_model)
    schemas = _reachable(paths, defs.get("$defs", {}))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "OpenAI-compatible API of a Baton router. Every error is an OpenAI error object.",
        },
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
