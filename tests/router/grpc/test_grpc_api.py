"""The gRPC frontend end to end: a real ``GrpcServer`` on loopback (its own event loop in a thread)
in front of the scripted ``FakeRouter``, driven by sync clients built from the committed stubs."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from engine.sampling_params import SamplingParams
from router.api import ChatMessage, ErrorKind, Readiness, RouterError
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc
from router.grpc_server import GrpcServer
from tests.router.fake_router import WORDS, FakeRouter
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ServerThread:
    """A ``GrpcServer`` serving from its own event loop in a daemon thread."""

    def __init__(self, router: FakeRouter) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpc-test-loop", daemon=True)
        self.thread.start()
        self.server = GrpcServer(router, "127.0.0.1", 0, health_interval_s=0.1)
        self.port = self.run(self.server.start())

    def run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def fake() -> FakeRouter:
    return FakeRouter(max_model_len=1000, check_vocab=True)


@pytest.fixture
def channel(fake: FakeRouter) -> Iterator[grpc.Channel]:
    srv = ServerThread(fake)
    ch = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    try:
        yield ch
    finally:
        ch.close()
        srv.close()


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.GenerationStub:
    return pb_grpc.GenerationStub(channel)


def rpc_error(fn: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


def text_req(text: str = "hello world", max_tokens: int = 5, **kw) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParameters(max_tokens=max_tokens), **kw)


# -- streaming ------------------------------------------------------------------------------------
def test_generate_text_streams_deltas(stub, fake):
    sent = time.monotonic()
    msgs = list(stub.Generate(text_req("hello world", 5), timeout=10))
    done = time.monotonic()
    assert len(msgs) == 5
    assert "".join(m.text for m in msgs) == "".join(WORDS[:5])
    assert [t for m in msgs for t in m.token_ids] == [100, 101, 102, 103, 104]
    assert [m.finished for m in msgs] == [False] * 4 + [True]
    assert all(not m.HasField("usage") for m in msgs[:-1])
    last = msgs[-1]
    assert last.finish_reason == "length"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.cached_tokens) == (2, 5, 0)
    assert {m.request_id for m in msgs} == {last.request_id} and last.request_id
    assert {m.lane for m in msgs} == {"interactive"}
    req = fake.requests[-1]
    assert (req.prompt, req.endpoint, req.stream, req.tenant, req.max_tokens_given) == (
        "hello world",
        "grpc",
        True,
        "default",
        True,
    )
    assert req.deadline_s is not None  # the sync stub's timeout=10 becomes the router's deadline
    # grpc-timeout is sent in coarse units rounded up (10 s can arrive as 10.1 s), hence the slack
    assert 9 < req.deadline_s - sent <= 10.5 + (done - sent)
    assert fake.completed == [last.request_id] and fake.aborted == []


def test_generate_token_ids_with_lane_and_ids(stub, fake):
    req = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[1, 2, 3]),
        lane="batch",
        request_id="rid-1",
        idempotency_key="idem-1",
        sampling=pb.SamplingParameters(max_tokens=3, stop=["beta"]),
    )
    msgs = list(stub.Generate(req))
    assert "".join(m.text for m in msgs) == "alpha beta"
    assert msgs[-1].finish_reason == "stop" and msgs[-1].usage.prompt_tokens == 3
    assert {(m.request_id, m.lane) for m in msgs} == {("rid-1", "batch")}
    got = fake.requests[-1]
    assert (got.prompt_token_ids, got.lane, got.request_id, got.idempotency_key) == (
        (1, 2, 3),
        "batch",
        "rid-1",
        "idem-1",
    )
    assert got.deadline_s is None  # no client deadline


def test_generate_chat(stub, fake):
    chat = pb.ChatMessages(
        messages=[pb.ChatMessage(role="system", content="be brief"), pb.ChatMessage(role="user", content="hi there")]
    )
    msgs = list(stub.Generate(pb.GenerateRequest(chat=chat, sampling=pb.SamplingParameters(max_tokens=2))))
    assert "".join(m.text for m in msgs) == "alpha beta"
    got = fake.requests[-1]
    assert got.messages == (ChatMessage("system", "be brief"), ChatMessage("user", "hi there"))
    assert got.add_generation_prompt is True
    chat.add_generation_prompt = False
    list(stub.Generate(pb.GenerateRequest(chat=chat, sampling=pb.SamplingParameters(max_tokens=1))))
    assert fake.requests[-1].add_generation_prompt is False
    # OpenAI's "developer" is the templates' "system", as over HTTP (was rendered as "developer")
    dev = pb.ChatMessages(
        messages=[pb.ChatMessage(role="developer", content="be brief"), pb.ChatMessage(role="user", content="hi")]
    )
    list(stub.Generate(pb.GenerateRequest(chat=dev, sampling=pb.SamplingParameters(max_tokens=1))))
    assert fake.requests[-1].messages == (ChatMessage("system", "be brief"), ChatMessage("user", "hi"))
    # an assistant turn may leave its content out (OpenAI's rule): it is empty
    turns = pb.ChatMessages(
        messages=[
            pb.ChatMessage(role="user", content="hi"),
            pb.ChatMessage(role="assistant"),
            pb.ChatMessage(role="user", content=""),
        ]
    )
    list(stub.Generate(pb.GenerateRequest(chat=turns, sampling=pb.SamplingParameters(max_tokens=1))))
    assert fake.requests[-1].messages == (
        ChatMessage("user", "hi"),
        ChatMessage("assistant", ""),
        ChatMessage("user", ""),
    )


def test_sampling_fields_and_defaults(stub, fake):
    list(stub.Generate(pb.GenerateRequest(text="x")))  # no sampling message: engine defaults
    assert fake.requests[-1].sampling == SamplingParams() and fake.requests[-1].max_tokens_given is False
    sp = pb.SamplingParameters(
        max_tokens=4,
        temperature=0.5,
        top_p=0.9,
        top_k=7,
        seed=-3,
        stop=["zz"],
        stop_token_ids=[2],
        ignore_eos=True,
        min_tokens=1,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    list(stub.Generate(pb.GenerateRequest(text="x", sampling=sp)))
    assert fake.requests[-1].sampling == SamplingParams(
        max_tokens=4,
        temperature=0.5,
        top_p=0.9,
        top_k=7,
        seed=-3,
        stop=("zz",),
        stop_token_ids=(2,),
        ignore_eos=True,
        min_tokens=1,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )


def test_logprobs(stub, fake):
    msgs = list(stub.Generate(pb.GenerateRequest(text="x", sampling=SP(max_tokens=2, logprobs=2))))
    assert fake.requests[-1].sampling.logprobs == 2
    lps = [lp for m in msgs for lp in m.logprobs]
    assert [(lp.token_id, lp.token, round(lp.logprob, 4)) for lp in lps] == [
        (100, b"alpha", -0.25),
        (101, b" beta", -0.5),
    ]
    assert [(t.token_id, t.token, round(t.logprob, 4)) for t in lps[0].top_logprobs] == [
        (300, b"\xc3", -0.15),
        (100, b"alpha", -0.25),
    ]  # most likely first; half a character, exact
    assert all(len(m.logprobs) == len(m.token_ids) for m in msgs)
    plain = list(stub.Generate(text_req(max_tokens=2)))  # not asked: none
    assert fake.requests[-1].sampling.logprobs is None and not any(m.logprobs for m in plain)
    assert not any(m.prompt_logprobs for m in plain)


def test_penalties_and_logit_bias(stub, fake):
    sp = SP(max_tokens=1, presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.3, logit_bias={9: -100.0})
    list(stub.Generate(pb.GenerateRequest(text="x", sampling=sp)))
    got = fake.requests[-1].sampling
    assert (got.presence_penalty, got.frequency_penalty, got.repetition_penalty, got.logit_bias) == (
        0.5,
        -0.25,
        1.3,
        ((9, -100.0),),
    )


def test_prompt_logprobs(stub, fake):
    msgs = list(stub.Generate(pb.GenerateRequest(text="a b c", sampling=SP(max_tokens=2, prompt_logprobs=1))))
    assert fake.requests[-1].sampling.prompt_logprobs == 1
    assert [(lp.token_id, lp.token, lp.logprob) for lp in msgs[0].prompt_logprobs] == [
        (501, b"p1", -0.125),
        (502, b"p2", -0.25),
    ]  # from the second prompt token on
    assert all(not m.prompt_logprobs for m in msgs[1:])


def test_n_choices(stub, fake):
    msgs = list(stub.Generate(pb.GenerateRequest(text="x", request_id="r", n=3, sampling=SP(max_tokens=3, seed=4))))
    assert [q.request_id for q in fake.requests] == ["r-0", "r-1", "r-2"]
    assert [q.sampling.seed for q in fake.requests] == [4, 5, 6]
    for i in range(3):
        mine = [m for m in msgs if m.index == i]
        assert "".join(m.text for m in mine) == "alpha beta gamma" and mine[-1].finished
        assert [m.finished for m in mine].count(True) == 1 and mine[-1].request_id == f"r-{i}"


def test_n_choices_cancelled_are_all_stopped(stub, fake):
    fake.token_delay_s = 0.05
    call = stub.Generate(text_req(max_tokens=200, request_id="c", n=2))
    next(call)
    call.cancel()
    wait_until(lambda: {"c-0", "c-1"} <= set(fake.aborted), timeout_s=2.0, message=lambda: f"aborts ({fake.aborted})")


def test_in_band_error_aborts_after_sent_messages(stub, fake):
    fake.fail_after_tokens = 2
    call = stub.Generate(text_req(max_tokens=5, request_id="r-err"))
    got = []
    err = rpc_error(lambda: got.extend(call))
    assert len(got) == 2
    assert err.code() == grpc.StatusCode.INTERNAL and "decode worker failed" in err.details()
    assert "r-err" not in fake.aborted  # the request already ended; nothing to stop


# -- deadline and cancellation ------------------------------------------------------------------
def test_deadline_mid_stream_aborts_request(stub, fake):
    fake.token_delay_s = 0.05
    call = stub.Generate(text_req(max_tokens=200, request_id="r-deadline"), timeout=1.5)  # 10 s of tokens
    got = []
    err = rpc_error(lambda: got.extend(call))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0 < len(got) < 200
    wait_until(lambda: "r-deadline" in fake.aborted, timeout_s=3.0, message=lambda: f"aborts ({fake.aborted})")
    assert fake.requests[-1].deadline_s is not None


def test_client_cancel_aborts_request(stub, fake):
    fake.token_delay_s = 0.05
    call = stub.Generate(text_req(max_tokens=200, request_id="r-cancel"))
    assert next(call).request_id == "r-cancel"
    next(call)
    call.cancel()
    wait_until(lambda: "r-cancel" in fake.aborted, timeout_s=3.0, message=lambda: f"aborts ({fake.aborted})")
    assert "r-cancel" not in fake.completed


def test_server_stop_aborts_in_flight_requests(fake):
    fake.token_delay_s = 0.05
    srv = ServerThread(fake)
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        call = pb_grpc.GenerationStub(ch).Generate(text_req(max_tokens=200, request_id="r-stop"))
        next(call)
        srv.close()  # grace 0: in-flight handlers are cancelled
        assert rpc_error(lambda: list(call)).code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    wait_until(lambda: "r-stop" in fake.aborted, timeout_s=3.0, message=lambda: f"aborts ({fake.aborted})")


# -- unary RPCs ---------------------------------------------------------------------------------
def test_abort_rpc(stub, fake):
    assert stub.Abort(pb.AbortRequest(request_id="r-9")).aborted is True
    assert fake.aborted == ["r-9"]
    assert rpc_error(lambda: stub.Abort(pb.AbortRequest())).code() == grpc.StatusCode.INVALID_ARGUMENT
    for bad in ("a\nb", "x" * 132, "job/1"):  # no request can have such an id (router.request_ids)
        err = rpc_error(lambda: stub.Abort(pb.AbortRequest(request_id=bad)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in err.details()
    assert fake.aborted == ["r-9"]


def test_get_model_info(stub):
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert (info.id, info.max_model_len, info.vocab_size, list(info.lanes), info.owned_by) == (
        "fake-model",
        1000,
        1000,
        ["interactive", "batch"],
        "baton",
    )
    assert abs(info.created - time.time()) < 60


# -- health and reflection ----------------------------------------------------------------------
def test_health_follows_readiness(channel, fake):
    fake.require_auth = True  # health stays open
    health = health_pb2_grpc.HealthStub(channel)

    def check(service: str) -> int:
        return health.Check(health_pb2.HealthCheckRequest(service=service)).status

    assert check("") == SERVING and check("baton.v1.Generation") == SERVING
    fake.ready = Readiness(False, "draining")
    assert check("") == NOT_SERVING and check("baton.v1.Generation") == NOT_SERVING
    fake.ready = Readiness(True)
    assert check("") == SERVING
    assert rpc_error(lambda: check("no.such.Service")).code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_sees_periodic_refresh(channel, fake):
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert next(watch).status == SERVING
    fake.ready = Readiness(False, "no live decode worker")
    assert next(watch).status == NOT_SERVING  # pushed by the refresh task, no Check involved
    watch.cancel()


def test_reflection_lists_services(channel, fake):
    fake.require_auth = True  # reflection stays open
    db = ProtoReflectionDescriptorDatabase(channel)
    assert {"baton.v1.Generation", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(
        db.get_services()
    )
    service = DescriptorPool(db).FindServiceByName("baton.v1.Generation")
    assert {m.name for m in service.methods} == {"Generate", "Abort", "GetModelInfo"}
    assert service.methods_by_name["Generate"].server_streaming


# -- errors -------------------------------------------------------------------------------------
SP = pb.SamplingParameters
BAD_INPUTS = {
    "no input": (pb.GenerateRequest(sampling=SP(max_tokens=1)), "input"),
    "empty text": (pb.GenerateRequest(text=""), "text"),
    "empty token ids": (pb.GenerateRequest(token_ids=pb.TokenIds()), "token_ids"),
    "empty chat": (pb.GenerateRequest(chat=pb.ChatMessages()), "chat.messages"),
    "chat without role": (
        pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(content="hi")])),
        "chat.messages[0].role",
    ),
    "chat with an unknown role": (
        pb.GenerateRequest(
            chat=pb.ChatMessages(
                messages=[pb.ChatMessage(role="user", content="hi"), pb.ChatMessage(role="bogus", content="hi")]
            )
        ),
        "chat.messages[1].role",
    ),
    # absent, as over HTTP (400 "A 'user' message needs 'content'."); an empty string is content
    "user message without content": (
        pb.GenerateRequest(
            chat=pb.ChatMessages(messages=[pb.ChatMessage(role="system", content=""), pb.ChatMessage(role="user")])
        ),
        "chat.messages[1].content",
    ),
    "max_tokens 0": (text_req(max_tokens=0), "sampling.max_tokens"),
    "negative temperature": (pb.GenerateRequest(text="x", sampling=SP(temperature=-1)), "sampling.temperature"),
    "nan temperature": (pb.GenerateRequest(text="x", sampling=SP(temperature=math.nan)), "sampling.temperature"),
    "top_p 0": (pb.GenerateRequest(text="x", sampling=SP(top_p=0)), "sampling.top_p"),
    "top_p > 1": (pb.GenerateRequest(text="x", sampling=SP(top_p=1.5)), "sampling.top_p"),
    "negative top_k": (pb.GenerateRequest(text="x", sampling=SP(top_k=-1)), "sampling.top_k"),
    "min > max tokens": (pb.GenerateRequest(text="x", sampling=SP(max_tokens=2, min_tokens=3)), "sampling.min_tokens"),
    "empty stop string": (pb.GenerateRequest(text="x", sampling=SP(stop=[""])), "sampling.stop"),
    # each is checked against every token: 3,000,000 of them slowed every request on the worker ~40x
    "too many stop token ids": (
        pb.GenerateRequest(text="x", sampling=SP(stop_token_ids=[7] * 1025)),
        "sampling.stop_token_ids",
    ),
    "logprobs > 20": (pb.GenerateRequest(text="x", sampling=SP(logprobs=21)), "sampling.logprobs"),
    "negative logprobs": (pb.GenerateRequest(text="x", sampling=SP(logprobs=-1)), "sampling.logprobs"),
    "prompt_logprobs > 20": (pb.GenerateRequest(text="x", sampling=SP(prompt_logprobs=21)), "sampling.prompt_logprobs"),
    "presence_penalty > 2": (
        pb.GenerateRequest(text="x", sampling=SP(presence_penalty=3)),
        "sampling.presence_penalty",
    ),
    "logit_bias > 100": (pb.GenerateRequest(text="x", sampling=SP(logit_bias={1: 200})), "sampling.logit_bias"),
    "min_p > 1": (pb.GenerateRequest(text="x", sampling=SP(min_p=2)), "sampling.min_p"),
    "n 0": (text_req(n=0), "n"),
    "n 17": (text_req(n=17), "n"),
    "empty lane": (text_req(lane=""), "lane"),
    "empty request id": (text_req(request_id=""), "request_id"),
    "long request id": (text_req(request_id="r" * 300), "request_id"),
    "unknown lane (router)": (text_req(lane="vip"), "lane"),
    "context length (router)": (text_req(max_tokens=999), "sampling.max_tokens"),
    # the router names the prompt "prompt": the path is the input the request used (was always "text")
    "token id outside the vocabulary (router)": (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 5000])), "token_ids"),
}


@pytest.mark.parametrize("request_msg,field", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_invalid_argument_naming_the_field(stub, fake, request_msg, field):
    err = rpc_error(lambda: list(stub.Generate(request_msg)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(f"{field}: "), err.details()
    assert fake.aborted == [] and fake.completed == []


def test_context_length_carries_error_code(stub):
    err = rpc_error(lambda: list(stub.Generate(text_req(max_tokens=999))))
    trailers = dict(err.trailing_metadata())
    assert trailers["baton-error-code"] == "context_length_exceeded"
    assert trailers["baton-error-param"] == "sampling.max_tokens"


@pytest.mark.parametrize(
    "kind,retry_after_s,code,retry_after",
    [
        (ErrorKind.RATE_LIMITED, 2.5, grpc.StatusCode.RESOURCE_EXHAUSTED, "3"),
        (ErrorKind.OVERLOADED, 0.2, grpc.StatusCode.UNAVAILABLE, "1"),
        (ErrorKind.OVERLOADED, None, grpc.StatusCode.UNAVAILABLE, None),
        (ErrorKind.CONFLICT, None, grpc.StatusCode.ALREADY_EXISTS, None),
        (ErrorKind.INTERNAL, 5.0, grpc.StatusCode.INTERNAL, None),  # retry-after only where it means "throttled"
    ],
)
def test_router_error_mapping(stub, fake, kind, retry_after_s, code, retry_after):
    fake.fail_next = RouterError(kind, f"scripted {kind.name}", retry_after_s=retry_after_s)
    err = rpc_error(lambda: list(stub.Generate(text_req())))
    assert err.code() == code and err.details() == f"scripted {kind.name}"
    assert dict(err.trailing_metadata()).get("retry-after") == retry_after


def test_http_named_params_get_their_proto_paths(stub, fake):
    fake.fail_next = RouterError(
        ErrorKind.CONFLICT, "This Idempotency-Key was already used with a different request.", param="Idempotency-Key"
    )
    err = rpc_error(lambda: list(stub.Generate(text_req(idempotency_key="k1"))))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert dict(err.trailing_metadata())["baton-error-param"] == "idempotency_key"


@pytest.mark.parametrize(
    "method,raw",
    [
        ("Generate", b"\xff\xff\xff\xff"),  # corrupt wire format
        ("Generate", b"\x0a\x03\xff\xfe\xfd"),  # text (field 1) holding invalid UTF-8
        ("Abort", b"\x0a\x02\xc3\x28"),  # request_id (field 1) holding invalid UTF-8
        ("GetModelInfo", b"\xff\xff\xff\xff"),
    ],
)
def test_bytes_that_are_not_the_request_message_are_invalid_argument(channel, fake, method, raw):
    path = f"/baton.v1.Generation/{method}"
    call = (channel.unary_stream if method == "Generate" else channel.unary_unary)(
        path, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    err = rpc_error(lambda: list(call(raw)) if method == "Generate" else call(raw))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err  # was UNKNOWN, naming a Python exception class
    assert "is not a valid baton.v1." in err.details() and fake.requests == []


def test_authentication(stub, fake):
    fake.require_auth = True
    for metadata in [(), (("authorization", "Bearer sk-wrong"),), (("authorization", "Basic sk-test"),)]:
        err = rpc_error(lambda: list(stub.Generate(text_req(), metadata=metadata)))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
    for call in (
        lambda md: stub.Abort(pb.AbortRequest(request_id="x"), metadata=md),
        lambda md: stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=md),
    ):
        assert rpc_error(lambda: call(())).code() == grpc.StatusCode.UNAUTHENTICATED
    assert fake.requests == [] and fake.aborted == []
    good = (("authorization", "Bearer sk-test"),)
    assert list(stub.Generate(text_req(max_tokens=2), metadata=good))[-1].finished
    assert fake.requests[-1].tenant == "acme"
    assert stub.Abort(pb.AbortRequest(request_id="x"), metadata=good).aborted
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=good).id == "fake-model"


# -- stubs ------------------------------------------------------------------------------------------
def test_committed_stubs_match_regeneration():
    out = subprocess.run(
        [sys.executable, "-m", "router.grpc_gen.generate", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_grpc_server_does_not_import_torch():
    code = "import sys, router.grpc_server; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr
