"""The gRPC frontend: ``baton.v1.Generation`` over ``grpc.aio``, plus health and reflection.

asyncio on purpose: the servicer awaits the router directly and shares the event loop with the
HTTP frontend, so a streaming request costs a coroutine rather than a thread. The servicer only
translates - wire shape checks, ``authorization`` metadata, proto <-> ``router.api`` types, and
``RouterError`` -> status code - and leaves admission and limits to the ``RouterAPI``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Awaitable, Callable, NoReturn, Sequence, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.errors import InvalidParameterError
from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams
from router.api import ChatMessage, ErrorKind, GenerateRequest, RouterAPI, RouterError, StreamEvent, invalid
from router.choices import MAX_CHOICES, Choices
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

GENERATION_SERVICE = pb.DESCRIPTOR.services_by_name["Generation"].full_name  # "baton.v1.Generation"
_MAX_ID_LEN = 256
# Router errors name OpenAI request fields; gRPC clients know them by their proto path.
_SAMPLING_FIELDS = frozenset(pb.SamplingParameters.DESCRIPTOR.fields_by_name)
_FIELD_PATHS = {"prompt": "text", "prompt_token_ids": "token_ids", "messages": "chat.messages"}


# -- errors -------------------------------------------------------------------------------------
def _field_path(param: str) -> str:
    if param in _SAMPLING_FIELDS:
        return f"sampling.{param}"
    return _FIELD_PATHS.get(param, param)


def status_for(err: RouterError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, details, trailing metadata) for a router error. INVALID_ARGUMENT details start with
    the field path; ``retry-after`` (whole seconds, >= 1) tells throttled clients when to retry."""
    code = grpc.StatusCode[err.kind.grpc_code]
    details = err.message
    if err.kind is ErrorKind.INVALID_REQUEST and err.param:
        path = _field_path(err.param)
        if not details.startswith(f"{path}:"):
            details = f"{path}: {details}"
    trailers: list[tuple[str, str]] = []
    if err.retry_after_s is not None and code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
        trailers.append(("retry-after", str(max(1, math.ceil(err.retry_after_s)))))
    if err.code:
        trailers.append(("baton-error-code", err.code))
    if err.param:
        trailers.append(("baton-error-param", _field_path(err.param)))
    return code, details, tuple(trailers)


async def _abort(context: grpc.aio.ServicerContext, err: RouterError) -> NoReturn:
    code, details, trailers = status_for(err)
    await context.abort(code, details, trailing_metadata=trailers)
    raise AssertionError("unreachable: context.abort raises")  # for type checkers


async def _guard(context: grpc.aio.ServicerContext, call: Awaitable[T]) -> T:
    """Await a router call, turning its failures into the RPC's status."""
    try:
        return await call
    except RouterError as err:
        await _abort(context, err)
    except InvalidParameterError as err:  # the router let an engine validation error through
        await _abort(context, invalid(err.message, param=err.param))
    except (grpc.aio.AbortError, asyncio.CancelledError):
        raise
    except Exception:
        log.exception("router call failed")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error")
    raise AssertionError("unreachable")


# -- proto -> router.api --------------------------------------------------------------------------
def _optional_str(msg: Any, name: str, *, max_len: int | None = None) -> str | None:
    if not msg.HasField(name):
        return None
    value = getattr(msg, name)
    if not value:
        raise invalid("must not be empty when set", param=name)
    if max_len is not None and len(value) > max_len:
        raise invalid(f"must be at most {max_len} characters", param=name)
    return value


def sampling_from_proto(msg: pb.SamplingParameters | None) -> SamplingParams:
    """Absent optional fields keep the ``SamplingParams`` defaults; its validation names the field."""
    if msg is None:
        return SamplingParams()
    kwargs: dict[str, Any] = {
        "stop": tuple(msg.stop), "stop_token_ids": tuple(msg.stop_token_ids),
        "ignore_eos": msg.ignore_eos, "include_stop_str_in_output": msg.include_stop_str_in_output,
        "logit_bias": dict(msg.logit_bias),
    }
    for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "min_tokens", "skip_special_tokens",
                 "logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
                 "min_p"):
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    try:
        return SamplingParams(**kwargs)
    except InvalidParameterError as err:
        raise invalid(err.message, param=f"sampling.{err.param}") from None


def request_from_proto(msg: pb.GenerateRequest, tenant: str, time_remaining: float | None) -> GenerateRequest:
    """Shape-check a ``GenerateRequest`` and build the router's; raises ``RouterError`` (invalid)."""
    prompt: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    add_generation_prompt = True
    kind = msg.WhichOneof("input")
    if kind is None:
        raise invalid("one of text, token_ids or chat is required", param="input")
    if kind == "text":
        if not msg.text:
            raise invalid("the prompt must not be empty", param="text")
        prompt = msg.text
    elif kind == "token_ids":
        if not msg.token_ids.ids:
            raise invalid("the prompt must contain at least one token id", param="token_ids")
        token_ids = tuple(msg.token_ids.ids)
    else:
        if not msg.chat.messages:
            raise invalid("at least one message is required", param="chat.messages")
        for i, m in enumerate(msg.chat.messages):
            if not m.role:
                raise invalid("the role must not be empty", param=f"chat.messages[{i}].role")
        messages = tuple(ChatMessage(m.role, m.content) for m in msg.chat.messages)
        if msg.chat.HasField("add_generation_prompt"):
            add_generation_prompt = msg.chat.add_generation_prompt
    has_sampling = msg.HasField("sampling")
    deadline_s = None
    if time_remaining is not None and math.isfinite(time_remaining):
        deadline_s = time.monotonic() + max(0.0, time_remaining)
    return GenerateRequest(
        sampling=sampling_from_proto(msg.sampling if has_sampling else None),
        prompt=prompt, prompt_token_ids=token_ids, messages=messages,
        add_generation_prompt=add_generation_prompt, stream=True,
        lane=_optional_str(msg, "lane"), tenant=tenant,
        request_id=_optional_str(msg, "request_id", max_len=_MAX_ID_LEN),
        idempotency_key=_optional_str(msg, "idempotency_key", max_len=_MAX_ID_LEN),
        max_tokens_given=has_sampling and msg.sampling.HasField("max_tokens"),
        deadline_s=deadline_s, endpoint="grpc",
    )


def _token_logprobs(logprobs: Sequence[TokenLogprob],
                    token_bytes: Callable[[Sequence[int]], list[bytes]]) -> list[pb.TokenLogprob]:
    if not logprobs:
        return []
    ids = [lp.token_id for lp in logprobs] + [t for lp in logprobs for t, _ in lp.top]
    raw = dict(zip(ids, token_bytes(ids)))
    return [pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, token=raw[lp.token_id],
                            top_logprobs=[pb.TopLogprob(token_id=t, logprob=v, token=raw[t]) for t, v in lp.top])
            for lp in logprobs]


def response_from_event(ev: StreamEvent, lane: str,
                        token_bytes: Callable[[Sequence[int]], list[bytes]] | None = None) -> pb.GenerateResponse:
    """``token_bytes`` names the tokens of the event's logprobs (RouterAPI.token_bytes)."""
    out = pb.GenerateResponse(request_id=ev.request_id, text=ev.text, token_ids=ev.token_ids,
                              finished=ev.finished, finish_reason=ev.finish_reason or "", lane=lane)
    if token_bytes is not None:
        out.logprobs.extend(_token_logprobs(ev.logprobs or (), token_bytes))
        out.prompt_logprobs.extend(_token_logprobs([lp for lp in ev.prompt_logprobs or () if lp.logprob is not None],
                                                   token_bytes))
    if ev.usage is not None:
        out.usage.CopyFrom(pb.Usage(prompt_tokens=ev.usage.prompt_tokens,
                                    completion_tokens=ev.usage.completion_tokens,
                                    cached_tokens=ev.usage.cached_tokens))
    if isinstance(ev.stop_reason, str):
        out.stop_string = ev.stop_reason
    elif isinstance(ev.stop_reason, int):
        out.stop_token_id = ev.stop_reason
    return out


# -- servicers ----------------------------------------------------------------------------------
class GenerationServicer(pb_grpc.GenerationServicer):
    """``baton.v1.Generation`` on top of a ``RouterAPI``."""

    def __init__(self, router: RouterAPI) -> None:
        self._router = router

    async def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's tenant from ``authorization: Bearer <key>`` (no header: key None)."""
        key: str | None = None
        for k, v in context.invocation_metadata() or ():
            if k.lower() == "authorization":
                scheme, _, token = str(v).strip().partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    await _abort(context, RouterError(ErrorKind.UNAUTHENTICATED,
                                                      "authorization metadata must be 'Bearer <key>'"))
                key = token.strip()
                break
        try:
            return self._router.authenticate(key)
        except RouterError as err:
            await _abort(context, err)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        tenant = await self._tenant(context)
        try:
            greq = request_from_proto(request, tenant, context.time_remaining())
            n = request.n if request.HasField("n") else 1
            if not 1 <= n <= MAX_CHOICES:
                raise invalid(f"must be in [1, {MAX_CHOICES}], got {n}", param="n")
        except RouterError as err:
            await _abort(context, err)
        choices = await _guard(context, Choices.start(self._router, greq, n))
        left = n  # choices not finished yet; any left on exit must be stopped
        events = choices.events()
        try:
            async for index, ev in events:
                if not left:
                    break  # nothing may follow the last event
                if ev.error is not None:  # failed after streaming started: the messages sent stand
                    left = 0  # the others were stopped with it
                    await _abort(context, ev.error)
                msg = response_from_event(ev, choices.lane, self._router.token_bytes)
                msg.index = index
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
            log.exception("generation stream %s failed", choices.request_id)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        finally:
            if left:
                # Shielded: a second cancellation (server shutdown) must not leave blocks allocated.
                await _shielded(choices.abort(), f"abort of {choices.request_id}")
            await _close(events)

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        tenant = await self._tenant(context)
        if not request.request_id:
            await _abort(context, invalid("must not be empty", param="request_id"))
        aborted = await _guard(context, self._router.abort(request.request_id, tenant))
        return pb.AbortResponse(aborted=bool(aborted))

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        await self._tenant(context)
        try:
            info = self._router.model_info()
        except RouterError as err:
            await _abort(context, err)
        return pb.ModelInfo(id=info.id, max_model_len=info.max_model_len, vocab_size=info.vocab_size,
                            created=info.created, lanes=info.lanes, owned_by=info.owned_by)


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


class ReadinessHealthServicer(health.aio.HealthServicer):
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

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext):
        await self.refresh()
        return await super().Check(request, context)

    async def run(self, interval_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)


# -- server -------------------------------------------------------------------------------------
class GrpcServer:
    """The gRPC frontend on ``host:port`` (port 0: any free port). ``start`` and ``stop`` run on the
    event loop that serves it - the same one as the HTTP server, if any.

    ``max_concurrent_rpcs`` bounds in-flight RPCs (beyond it gRPC answers RESOURCE_EXHAUSTED);
    ``grpc.aio`` runs handlers as coroutines, so there is no worker-thread pool to size.
    """

    def __init__(self, router: RouterAPI, host: str = "127.0.0.1", port: int = 0, *,
                 max_concurrent_rpcs: int | None = None, health_interval_s: float = 0.5,
                 options: tuple[tuple[str, Any], ...] = ()) -> None:
        self.router = router
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self._max_concurrent_rpcs = max_concurrent_rpcs
        self._health_interval_s = health_interval_s
        # No SO_REUSEPORT: a second server on a taken port must fail, not share it silently.
        self._options = (("grpc.so_reuseport", 0), *options)
        self._server: grpc.aio.Server | None = None
        self._health: ReadinessHealthServicer | None = None
        self._health_task: asyncio.Task | None = None

    async def start(self) -> int:
        """Bind, register the services and start serving; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("GrpcServer already started")
        server = grpc.aio.server(options=self._options, maximum_concurrent_rpcs=self._max_concurrent_rpcs)
        pb_grpc.add_GenerationServicer_to_server(GenerationServicer(self.router), server)
        self._health = ReadinessHealthServicer(self.router, ("", GENERATION_SERVICE))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((GENERATION_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        address = f"[{self.host}]:{self.requested_port}" if ":" in self.host else f"{self.host}:{self.requested_port}"
        try:
            port = server.add_insecure_port(address)
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
        return await self._server.wait_for_termination(timeout)
