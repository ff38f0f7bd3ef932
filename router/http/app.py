"""The OpenAI-compatible HTTP API in front of a ``RouterAPI``.

Endpoints (every ``/v1/*`` one authenticates with ``Authorization: Bearer <key>`` through
``RouterAPI.authenticate``, which decides whether a key is required at all):

- ``POST /v1/completions``, ``POST /v1/chat/completions``: OpenAI semantics, streaming as SSE.
  Baton extensions: ``lane`` (body) or ``X-Baton-Lane`` (header) picks a traffic-class lane;
  ``Idempotency-Key`` (header) makes retries safe; ``top_k``, ``min_tokens``, ``ignore_eos``,
  ``stop_token_ids``, ``repetition_penalty``, ``min_p``, ``include_stop_str_in_output`` and
  ``skip_special_tokens`` body fields. Responses carry ``X-Request-Id`` and ``X-Baton-Lane``.
  ``logprobs`` (completions: 0-20 alternatives) and ``logprobs`` + ``top_logprobs`` (chat) are
  reported in OpenAI's shapes (router/http/logprobs.py), streamed with their tokens. ``n`` (1-16)
  runs one router request per choice (router/choices.py); ``X-Request-Id`` then lists them.
- ``GET /v1/models``, ``GET /v1/models/{model}``: the served model.
- ``POST /tokenize`` (``prompt`` or ``messages``) -> ``{"count", "max_model_len", "tokens"}`` and
  ``POST /detokenize`` (``tokens``) -> ``{"prompt"}``, vLLM's: count and check tokens with the
  server's own tokenizer and chat template.
- ``GET /v1/batches/{job_id}``: fetch the durable result of a batch-lane job (``{"id", "status",
  "result"?}``); ``job_id`` is the id the router gave the job (the ``X-Request-Id`` of the request
  that created it). Poll it instead of holding a connection open for a long batch request.
- ``POST /v1/abort/{request_id}``: stop one of the caller's own in-flight requests (tenant-scoped;
  404 if the tenant has no such request). ``request_id`` is the ``X-Request-Id`` value.
- ``GET /openapi.json``: this API as OpenAPI 3.1 (router/http/openapi.py), its request and response
  models, streams and errors, for clients' tools.
- ``GET /health`` (liveness), ``GET /ready`` (200/503 with the reason), ``GET /metrics``
  (Prometheus): never authenticated, so probes and scrapers need no key.

Every error, including 404/405 and bodies FastAPI would answer with 422, is an OpenAI error object
``{"error": {"message", "type", "param", "code"}}``: clients (the openai package among them) only
understand that shape. Request bodies are parsed here, not by FastAPI, for that reason. A body over
``max_body_bytes`` (16 MiB by default) is refused with 413 before it is read whole (router/http/body.py).

A client that goes away is noticed by waiting on the ASGI ``http.disconnect`` message next to the
generation, so its request is aborted at once (streaming or not) instead of at the next write.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from engine.sampling_params import SamplingParams
from router.api import ErrorKind, GenerateRequest, RouterAPI, RouterError, invalid
from router.choices import Choices
from router.http.body import MAX_BODY_BYTES, read_and_parse
from router.http.errors import CLIENT_CLOSED, guarded, install_error_handlers, json_response
from router.http.logprobs import LogprobsFormatter
from router.http.openapi import openapi_document
from router.http.responses import (
    ChunkBuilder,
    baton_version,
    chat_completion,
    dumps,
    prompt_only,
    system_fingerprint,
    text_completion,
)
from router.http.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from router.http.streaming import SSEResponse, sse_events, unless_disconnected
from router.request_ids import MAX_CHOICE_ID_LEN, REQUEST_ID_RULE, is_valid_request_id
from router.tool_calls.constraint import tool_call_constraint
from router.tool_calls.parsers import ToolFormat, format_for_tokenizer, keep_markup

OFF_LOOP_TOKENS = 8192  # /detokenize decodes longer token lists on a thread (shorter: under a millisecond)


# -- helpers ------------------------------------------------------------------------------------
def _api_key(request: Request) -> str | None:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


# -- the app ------------------------------------------------------------------------------------
def client_request_id(request: Request) -> str | None:
    """A client-chosen ``X-Request-Id`` (1-128 of ``[A-Za-z0-9._-]``, router/request_ids.py): it
    names a durable batch job, so a client can fetch the result with ``GET /v1/batches/{id}`` even
    after losing its connection."""
    rid = request.headers.get("x-request-id")
    if rid is None:
        return None
    if not is_valid_request_id(rid):
        raise invalid(f"X-Request-Id must be {REQUEST_ID_RULE}.", param="X-Request-Id", code="invalid_request_id")
    return rid


def create_app(
    router: RouterAPI,
    *,
    served_model_name: str,
    default_temperature: float = 1.0,
    default_max_tokens: int | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    tool_format: ToolFormat | None = None,
) -> FastAPI:
    """The HTTP frontend of ``router``. ``served_model_name`` is the model id clients send and
    ``/v1/models`` lists (the router's own ``ModelInfo.id`` is accepted too). ``default_temperature``
    applies when a request omits ``temperature`` (OpenAI's default is 1.0). ``default_max_tokens``
    bounds a chat request that bounds nothing itself; None means the model's context length, sent
    with ``max_tokens_given=False`` so the router can clamp it to what the prompt leaves.
    ``max_body_bytes`` bounds a request body (413 above it)."""
    # (FastAPI's own /openapi.json would describe no route: the endpoints parse their own bodies)
    app = FastAPI(title="Baton", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    api_document = dumps(openapi_document("Baton", baton_version(), served_model_name))
    fingerprint = system_fingerprint(served_model_name)

    def tenant_of(request: Request) -> str:
        return router.authenticate(_api_key(request))

    @functools.cache
    def tools_format() -> ToolFormat:
        """The tool-call format: the configured one, else the one the model's chat template teaches."""
        if tool_format is not None:
            return tool_format
        return format_for_tokenizer(getattr(router, "tokenizer", None), router.model_info().id)

    def check_model(model: str | None) -> None:
        if model is not None and model not in (served_model_name, router.model_info().id):
            raise RouterError(
                ErrorKind.NOT_FOUND, f"The model '{model}' does not exist.", param="model", code="model_not_found"
            )

    def pick_lane(body_lane: str | None, request: Request) -> str | None:
        header_lane = request.headers.get("x-baton-lane") or None
        if body_lane is not None and header_lane is not None and body_lane != header_lane:
            raise invalid(
                f"The 'lane' field ({body_lane!r}) and the X-Baton-Lane header ({header_lane!r}) disagree.",
                param="lane",
            )
        return body_lane if body_lane is not None else header_lane

    async def authenticated_body(request: Request, schema: type) -> tuple[str, Any]:
        """(tenant, the parsed body): the key is checked before the body is looked at, as OpenAI
        does; the body's ``model`` must be the served one."""
        tenant = tenant_of(request)
        body = await read_and_parse(request, schema, max_body_bytes)
        check_model(body.model)
        return tenant, body

    async def generate(request: Request, chat: bool) -> Response:
        tenant, body = await authenticated_body(request, ChatCompletionRequest if chat else CompletionRequest)
        echo_text = None
        if chat:
            sampling = body.sampling_params(
                default_temperature=default_temperature,
                default_max_tokens=default_max_tokens or router.model_info().max_model_len,
            )
            inputs: dict[str, Any] = {
                "messages": body.router_messages(),
                "add_generation_prompt": body.add_generation_prompt,
                "tools": body.tools or (),
            }
            forced = body.forced_tools()
            if forced:  # required / a named function: the output is a call, by grammar
                if sampling.structured is not None:
                    raise invalid(
                        f"'tool_choice' {body.tool_choice!r} cannot be combined with "
                        f"'{sampling.structured.field.split('.')[0]}'.",
                        param="tool_choice",
                    )
                sampling = replace(
                    sampling, structured=tool_call_constraint(tools_format(), forced, body.parallel_tool_calls)
                )
            if body.parses_tools:
                sampling = keep_markup(tools_format(), sampling)
        else:
            sampling = body.sampling_params(default_temperature=default_temperature)
            prompt_is_text = isinstance(body.prompt, str)
            inputs = {"prompt": body.prompt} if prompt_is_text else {"prompt_token_ids": body.prompt}
            inputs["echo_prompt"] = bool(body.echo)
        gen = GenerateRequest(
            sampling=sampling,
            stream=body.wants_stream,
            lane=pick_lane(body.lane, request),
            tenant=tenant,
            idempotency_key=request.headers.get("idempotency-key") or None,
            request_id=client_request_id(request),
            max_tokens_given=body.max_tokens_given,
            max_tokens_param="max_completion_tokens"
            if chat and body.max_completion_tokens is not None
            else "max_tokens",
            endpoint="chat" if chat else "completions",
            traceparent=request.headers.get("traceparent"),
            tracestate=request.headers.get("tracestate"),
            **inputs,
        )
        created = int(time.time())
        choices = await Choices.start(router, gen, body.n or 1)
        if not chat and body.echo:  # a token-id prompt is echoed as its text (the router checked its ids)
            echo_text = body.prompt if isinstance(body.prompt, str) else router.detokenize(list(body.prompt))
        headers = {"X-Request-Id": choices.request_id, "X-Baton-Lane": choices.lane}
        model = body.model or served_model_name

        def logprobs_for(echoed: str | None) -> Callable[[], LogprobsFormatter] | None:
            if sampling.logprobs is None:
                return None
            return functools.partial(LogprobsFormatter, router.token_bytes, chat=chat, echo_text=echoed)

        if body.wants_stream:
            chunks = ChunkBuilder(
                choices.streams[0].request_id,
                model,
                created,
                chat=chat,
                fingerprint=fingerprint,
                include_usage=body.include_usage,
                logprobs=logprobs_for(echo_text),
                tool_format=tools_format() if chat and body.parses_tools else None,
            )
            return SSEResponse(sse_events(choices, chunks, echo_text), choices, headers)
        try:
            done, results = await unless_disconnected(choices.results(), request.receive)
        except RouterError:  # the router ended the request itself
            await choices.abort()  # the other choices, if any
            raise
        except BaseException:  # a bug, or cancelled by a server shutdown: free the request
            await choices.abort()
            raise
        if not done or results is None:
            await choices.abort()
            return Response(status_code=CLIENT_CLOSED, headers=headers)
        if chat:
            return json_response(
                chat_completion(
                    results,
                    model=model,
                    created=created,
                    fingerprint=fingerprint,
                    logprobs=logprobs_for(None),
                    tool_format=tools_format() if body.parses_tools else None,
                ),
                headers=headers,
            )
        if body.echo and results[0].prompt_text is not None:
            echo_text = results[0].prompt_text
        if body.echo_only:  # the one token it ran for is not part of the answer
            results = [prompt_only(r) for r in results]
        return json_response(
            text_completion(
                results,
                model=model,
                created=created,
                fingerprint=fingerprint,
                echo_text=echo_text,
                logprobs=logprobs_for(echo_text),
            ),
            headers=headers,
        )

    @app.post("/v1/completions", include_in_schema=False)
    @guarded
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions", include_in_schema=False)
    @guarded
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    def model_card() -> dict[str, Any]:
        info = router.model_info()
        return {
            "id": served_model_name,
            "object": "model",
            "created": info.created,
            "owned_by": info.owned_by,
            "max_model_len": info.max_model_len,
            "lanes": list(info.lanes),
        }

    @app.post("/tokenize", include_in_schema=False)
    @guarded
    async def tokenize(request: Request) -> Response:
        _, body = await authenticated_body(request, TokenizeRequest)
        if (body.prompt is None) == (body.messages is None):
            raise invalid("Send exactly one of 'prompt' and 'messages'.", param="prompt")
        messages = tuple(m.to_router() for m in body.messages) if body.messages is not None else None
        gen = GenerateRequest(
            sampling=SamplingParams(),
            prompt=body.prompt,
            messages=messages,
            add_generation_prompt=body.add_generation_prompt,
        )
        max_model_len = router.model_info().max_model_len

        def answer() -> Response:
            ids = router.tokenize(gen)
            return json_response({"count": len(ids), "max_model_len": max_model_len, "tokens": ids})

        # On a thread: a huge prompt (and its answer's JSON) must not stall the event loop (the
        # tokenizer releases the GIL).
        return await asyncio.to_thread(answer)

    @app.post("/detokenize", include_in_schema=False)
    @guarded
    async def detokenize(request: Request) -> Response:
        _, body = await authenticated_body(request, DetokenizeRequest)

        def answer() -> Response:
            return json_response({"prompt": router.detokenize(body.tokens)})

        if len(body.tokens) < OFF_LOOP_TOKENS:
            return answer()
        # On a thread: checking and decoding a long list (megabytes of text) would stall the event loop.
        return await asyncio.to_thread(answer)

    @app.get("/v1/models", include_in_schema=False)
    @guarded
    async def list_models(request: Request) -> Response:
        tenant_of(request)
        return json_response({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}", include_in_schema=False)
    @guarded
    async def get_model(request: Request) -> Response:
        tenant_of(request)
        check_model(request.path_params["model_id"])
        return json_response(model_card())

    @app.get("/v1/batches/{job_id}", include_in_schema=False)
    @guarded
    async def batch_result(request: Request) -> Response:
        tenant = tenant_of(request)
        return json_response(await router.batch_result(request.path_params["job_id"], tenant))

    @app.post("/v1/abort/{request_id}", include_in_schema=False)
    @guarded
    async def abort(request: Request) -> Response:
        tenant = tenant_of(request)
        request_id = request.path_params["request_id"]
        if not await router.abort(request_id, tenant):
            shown = request_id[:MAX_CHOICE_ID_LEN]
            raise RouterError(ErrorKind.NOT_FOUND, f"No in-flight request {shown!r}.", param="request_id")
        return json_response({"id": request_id, "object": "abort", "aborted": True})

    @app.get("/openapi.json", include_in_schema=False)
    @guarded
    async def openapi(request: Request) -> Response:
        return Response(api_document, media_type="application/json")

    @app.api_route("/health", methods=["GET", "HEAD"], include_in_schema=False)
    @guarded
    async def health(request: Request) -> Response:
        return json_response({"status": "ok"})

    @app.api_route("/ready", methods=["GET", "HEAD"], include_in_schema=False)
    @guarded
    async def ready(request: Request) -> Response:
        r = router.readiness()
        body = {"status": "ready" if r.ready else "not_ready", "reason": r.reason, "details": r.details}
        return json_response(body, 200 if r.ready else 503)

    @app.get("/metrics", include_in_schema=False)
    @guarded
    async def metrics(request: Request) -> Response:
        data, content_type = router.metrics()
        return Response(data, media_type=content_type)

    return app
