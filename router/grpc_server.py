"""The gRPC frontend: ``baton.v1.Generation`` over ``grpc.aio``, plus health and reflection.

asyncio on purpose: the servicer awaits the router directly and shares the event loop with the
HTTP frontend, so a streaming request costs a coroutine rather than a thread. The servicer only
translates - wire shape checks, ``authorization`` metadata, proto <-> ``router.api`` types, and
``RouterError`` -> status code - and leaves admission and limits to the ``RouterAPI``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.errors import InvalidParameterError
from router.api import ErrorKind, RouterAPI, RouterError, invalid
from router.choices import MAX_CHOICES, Choices
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc
from router.grpc_messages import parses_tools, request_from_proto, response_from_event, tool_call_deltas
from router.request_ids import REQUEST_ID_RULE, names_a_request
from router.tool_calls.parsers import ToolFormat, format_for_tokenizer, new_call_id
from router.tool_calls.streaming import StreamDelta, ToolCallStream

log = logging.getLogger(__name__)
T = TypeVar("T")

GENERATION_SERVICE = pb.DESCRIPTOR.services_by_name["Generation"].full_name  # "baton.v1.Generation"
# Router errors name OpenAI request fields (and HTTP headers); gRPC clients know them by their proto path.
_SAMPLING_FIELDS = frozenset(pb.SamplingParameters.DESCRIPTOR.fields_by_name)
_FIELD_PATHS = {
    "prompt_token_ids": "token_ids",
    "messages": "chat.messages",
    "Idempotency-Key": "idempotency_key",
    "X-Request-Id": "request_id",
}
_PROMPT_PATHS = {"text": "text", "token_ids": "token_ids", "chat": "chat.messages"}  # by the request's input


# -- errors -------------------------------------------------------------------------------------
def _field_path(param: str, prompt_path: str = "text") -> str:
    if param in _SAMPLING_FIELDS:
        return f"sampling.{param}"
    if param == "prompt":  # the router's name for whichever input the request used
        return prompt_path
    return _FIELD_PATHS.get(param, param)


def status_for(err: RouterError, prompt_path: str = "text") -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, details, trailing metadata) for a router error. INVALID_ARGUMENT details start with
    the field path; ``retry-after`` (whole seconds, >= 1) tells throttled clients when to retry."""
    code = grpc.StatusCode[err.kind.grpc_code]
    details = err.message
    if err.kind is ErrorKind.INVALID_REQUEST and err.param:
        path = _field_path(err.param, prompt_path)
        if not details.startswith(f"{path}:"):
            details = f"{path}: {details}"
    trailers: list[tuple[str, str]] = []
    if err.retry_after_s is not None and code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
        trailers.append(("retry-after", str(max(1, math.ceil(err.retry_after_s)))))
    if err.code:
        trailers.append(("baton-error-code", err.code))
    if err.param:
        trailers.append(("baton-error-param", _field_path(err.param, prompt_path)))
    return code, details, tuple(trailers)


async def _abort(context: grpc.aio.ServicerContext, err: RouterError, prompt_path: str = "text") -> NoReturn:
    code, details, trailers = status_for(err, prompt_path)
    await context.abort(code, details, trailing_metadata=trailers)
    raise AssertionError("unreachable: context.abort raises")  # for type checkers


async def _guard(context: grpc.aio.ServicerContext, call: Awaitable[T], prompt_path: str = "text") -> T:
    """Await a router call, turning its failures into the RPC's status."""
    try:
        return await call
    except RouterError as err:
        await _abort(context, err, prompt_path)
    except InvalidParameterError as err:  # the router let an engine validation error through
        await _abort(context, invalid(err.message, param=err.param), prompt_path)
    except (grpc.aio.AbortError, asyncio.CancelledError):
        raise
    except Exception:
        log.exception("router call failed")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error")
    raise AssertionError("unreachable")


# -- servicers ----------------------------------------------------------------------------------
class GenerationServicer(pb_grpc.GenerationServicer):
    """``baton.v1.Generation`` on top of a ``RouterAPI``."""

    def __init__(self, router: RouterAPI, tool_format: ToolFormat | None = None) -> None:
        self._router = router
        self._tool_format = tool_format  # None: the one the model's chat template teaches (at first use)

    def tool_format(self) -> ToolFormat:
        if self._tool_format is None:
            self._tool_format = format_for_tokenizer(
                getattr(self._router, "tokenizer", None), self._router.model_info().id
            )
        return self._tool_format

    async def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's tenant from ``authorization: Bearer <key>`` (no header: key None)."""
        key: str | None = None
        for k, v in context.invocation_metadata() or ():
            if k.lower() == "authorization":
                scheme, _, token = str(v).strip().partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    await _abort(
                        context, RouterError(ErrorKind.UNAUTHENTICATED, "authorization metadata must be 'Bearer <key>'")
                    )
                key = token.strip()
                break
        try:
            return self._router.authenticate(key)
        except RouterError as err:
            await _abort(context, err)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        tenant = await self._tenant(context)
        prompt_path = _PROMPT_PATHS.get(request.WhichOneof("input") or "text", "text")
        try:
            greq = request_from_proto(request, tenant, context.time_remaining(), self.tool_format)
            trace_md = {
                k.lower(): str(v)
                for k, v in context.invocation_metadata() or ()
                if k.lower() in ("traceparent", "tracestate")
            }
            if trace_md:  # the client's W3C trace context: the request's spans join its trace
                greq = dataclasses.replace(
                    greq, traceparent=trace_md.get("traceparent"), tracestate=trace_md.get("tracestate")
                )
            n = request.n if request.HasField("n") else 1
            if not 1 <= n <= MAX_CHOICES:
                raise invalid(f"must be in [1, {MAX_CHOICES}], got {n}", param="n")
        except RouterError as err:
            await _abort(context, err, prompt_path)
        choices = await _guard(context, Choices.start(self._router, greq, n), prompt_path)
        left = n  # choices not finished yet; any left on exit must be stopped
        events = choices.events()
        tools = {i: ToolCallStream(self.tool_format(), new_call_id) for i in range(n)} if parses_tools(request) else {}
        try:
            async for index, ev in events:
                if not left:
                    break  # nothing may follow the last event
                if ev.error is not None:  # failed after streaming started: the messages sent stand
                    left = 0  # the others were stopped with it
                    if context.done():
                        break  # the RPC has ended already (its deadline): no status left to set
                    await _abort(context, ev.error, prompt_path)
                msg = response_from_event(ev, choices.lane, self._router.token_bytes)
                msg.index = index
                if tools:  # the text read for tool calls: markup held back, calls as deltas
                    _with_tool_calls(msg, tools[index], ev.text, ev.finished)
                await context.write(msg)
                # After the last event, iterate once more rather than break, so the stream's own
                # end-of-request code runs instead of being cut off by aclose().
                if ev.finished:
                    left -= 1
                if left and context.cancelled():
                    break
            else:
                left = 0  # the router ended the streams itself
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise  # client cancel / deadline (the task is cancelled) or our own abort
        except Exception:
            if not context.done():  # (once the RPC has ended, aborting it again only raises)
                log.exception("generation stream %s failed", choices.request_id)
                await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        finally:
            if left:
                # Shielded: a second cancellation (server shutdown) must not leave blocks allocated.
                await _shielded(choices.abort(), f"abort of {choices.request_id}")
            await _close(events)

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        tenant = await self._tenant(context)
        if not names_a_request(request.request_id):  # it could name no request
            await _abort(context, invalid(f"must be {REQUEST_ID_RULE}", param="request_id", code="invalid_request_id"))
        aborted = await _guard(context, self._router.abort(request.request_id, tenant))
        return pb.AbortResponse(aborted=bool(aborted))

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        await self._tenant(context)
        try:
            info = self._router.model_info()
        except RouterError as err:
            await _abort(context, err)
        return pb.ModelInfo(
            id=info.id,
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            created=info.created,
            lanes=info.lanes,
            owned_by=info.owned_by,
        )


def _with_tool_calls(msg: pb.GenerateResponse, stream: ToolCallStream, text: str, finished: bool) -> None:
    delta = stream.feed(text)
    if finished:
        rest = stream.finish()
        delta = StreamDelta(delta.content + rest.content, delta.tool_calls + rest.tool_calls)
        if msg.finish_reason == "stop" and stream.num_calls:
            msg.finish_reason = "tool_calls"
    msg.text = delta.content
    msg.tool_calls.extend(tool_call_deltas(delta))


async def _close(events: Any) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.debug("closing a generation stream failed", exc_info=True)


async def _shielded(call: Awaitable[Any], what: str) -> None:
    try:
        await asyncio.shield(call)
    except asyncio.CancelledError:
        pass  # the shielded call keeps running
    except Exception:
        log.exception("%s failed", what)


class ReadinessHealthServicer(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health ships no types
    """``grpc.health.v1.Health`` following ``router.readiness()``: refreshed on every Check (so a
    probe never sees a stale answer) and every ``interval_s`` for Watch streams."""

    def __init__(self, router: RouterAPI, services: tuple[str, ...]) -> None:
        super().__init__()
        self._router = router
        self._services = services
        self._last: int | None = None

    async def refresh(self) -> None:
        try:
            ready = self._router.readiness().ready
        except Exception:
            log.exception("readiness check failed")
            ready = False
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        if status != self._last:
            for service in self._services:
                await self.set(service, status)
            self._last = status

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        await self.refresh()
        return await super().Check(request, context)

    async def run(self, interval_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)


class _Malformed:
    """What a request's bytes parse to when they are not its message (a corrupt wire format, a string
    field holding invalid UTF-8): the handler answers INVALID_ARGUMENT, not gRPC's UNKNOWN."""

    def __init__(self, message_name: str, error: DecodeError) -> None:
        self.reason = f"the request is not a valid {message_name}: {error}"


def _parse(message_type: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as err:
            return _Malformed(message_type.DESCRIPTOR.full_name, err)

    return parse


def _checked(
    method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]],
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> T:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        return await method(request, context)

    return handle


def _add_generation_service(servicer: GenerationServicer, server: grpc.aio.Server) -> None:
    """``add_GenerationServicer_to_server``, with requests that fail to parse answered INVALID_ARGUMENT."""
    methods = pb.DESCRIPTOR.services_by_name["Generation"].methods_by_name
    handlers = {}
    for name, method in methods.items():
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        request_type, response_type = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[name] = make(
            _checked(getattr(servicer, name)),
            request_deserializer=_parse(request_type),
            response_serializer=response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GENERATION_SERVICE, handlers),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(GENERATION_SERVICE, handlers)


# -- server -------------------------------------------------------------------------------------
class GrpcServer:
    """The gRPC frontend on ``host:port`` (port 0: any free port). ``start`` and ``stop`` run on the
    event loop that serves it - the same one as the HTTP server, if any.

    ``max_concurrent_rpcs`` bounds in-flight RPCs (beyond it gRPC answers RESOURCE_EXHAUSTED);
    ``grpc.aio`` runs handlers as coroutines, so there is no worker-thread pool to size.
    """

    def __init__(
        self,
        router: RouterAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_concurrent_rpcs: int | None = None,
        health_interval_s: float = 0.5,
        options: tuple[tuple[str, Any], ...] = (),
        tool_format: ToolFormat | None = None,
    ) -> None:
        self.router = router
        self.tool_format = tool_format  # None: the one the model's chat template teaches
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self._max_concurrent_rpcs = max_concurrent_rpcs
        self._health_interval_s = health_interval_s
        # No SO_REUSEPORT: a second server on a taken port must fail, not share it silently.
        self._options = (("grpc.so_reuseport", 0), *options)
        self._server: grpc.aio.Server | None = None
        self._health: ReadinessHealthServicer | None = None
        self._health_task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind, register the services and start serving; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("GrpcServer already started")
        server = grpc.aio.server(options=self._options, maximum_concurrent_rpcs=self._max_concurrent_rpcs)
        _add_generation_service(GenerationServicer(self.router, self.tool_format), server)
        self._health = ReadinessHealthServicer(self.router, ("", GENERATION_SERVICE))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((GENERATION_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        address = f"[{self.host}]:{self.requested_port}" if ":" in self.host else f"{self.host}:{self.requested_port}"
        try:
            port: int = server.add_insecure_port(address)
        except RuntimeError as err:
            raise OSError(f"cannot bind the gRPC server to {address}: {err}") from err
        if port == 0:
            raise OSError(f"cannot bind the gRPC server to {address}")
        await self._health.refresh()
        await server.start()
        self._server, self.port = server, port
        self._health_task = asyncio.create_task(self._health.run(self._health_interval_s), name="grpc-health")
        log.info("gRPC server listening on %s:%d", self.host, port)
        return port

    async def stop(self, grace: float | None = 5.0) -> None:
        """Report NOT_SERVING, stop accepting RPCs and give in-flight ones ``grace`` seconds
        (None: wait for all; on expiry they are cancelled, which aborts their requests)."""
        if self._server is None:
            return
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._server is None:
            return True
        terminated: bool = await self._server.wait_for_termination(timeout)
        return terminated
