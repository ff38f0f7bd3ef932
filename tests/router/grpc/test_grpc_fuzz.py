"""Property-based fuzzing of the gRPC API: messages generated from the proto descriptors (every
field, nested message, oneof, repeated and map field of ``baton.v1``, each value anything its wire
type allows, mixed with values near the valid ones so that requests also get through to the engine),
sent to a real ``GrpcServer`` in front of a real router and engine (the tiny model,
tests/router/http/engine_stack.py), and raw bytes that are no message at all.

Each call must end OK (a stream whose every choice finishes once) or with a status a client can act
on: never UNKNOWN or INTERNAL; INVALID_ARGUMENT names the field (``baton-error-param`` trailer and
details starting with it). Bounded (``BATON_FUZZ_EXAMPLES`` examples per property, no deadline).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.api import CHAT_ROLES
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc
from tests.router.grpc.test_grpc_api import ServerThread
from tests.router.http.engine_stack import make_engine_router

EXAMPLES = int(os.environ.get("BATON_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
)
NEVER = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
UNPARSED = "the request is not a valid"  # (router/grpc_server.py's answer to bytes that are no message)
FINISH_REASONS = {"stop", "length", "abort", "tool_calls"}
MAX_DEPTH = 4

# Values that get past the shape checks, by field name: drawn as often as arbitrary ones.
_NEAR_VALID: dict[str, list[Any]] = {
    "role": list(CHAT_ROLES),
    "lane": ["interactive", "batch", "long_context"],
    "parameters_json": ["", "{}", '{"type": "object", "properties": {"a": {"type": "integer"}}}'],
    "json_schema": ['{"type": "object"}', '{"type": "string", "maxLength": 3}', "{"],
    "arguments": ["{}", '{"a": 1}', "[]"],
    "name": ["get_weather", "f", ""],
    "max_tokens": [1, 2, 4, 0, -1],
    "min_tokens": [0, 1, 3],
    "n": [1, 2, 0, 17],
    "logprobs": [0, 1, 5, 21, -1],
    "prompt_logprobs": [0, 1, 21],
    "temperature": [0.0, 0.7, -1.0, math.nan],
    "top_p": [1.0, 0.5, 0.0],
    "regex": ["[ab]{1,3}", "(", ""],
    "request_id": ["fuzz-1", "", "bad id!"],
}


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        base: st.SearchStrategy[Any] = st.text(max_size=24)
    elif t == FieldDescriptor.TYPE_BYTES:
        base = st.binary(max_size=16)
    elif t == FieldDescriptor.TYPE_BOOL:
        base = st.booleans()
    elif t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        width: Literal[32, 64] = 32 if t == FieldDescriptor.TYPE_FLOAT else 64
        base = st.one_of(st.floats(-3, 3, width=width), st.floats(width=width))
    elif t == FieldDescriptor.TYPE_ENUM:
        base = st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 50))
    else:
        unsigned = t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED32)
        bits = 64 if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64) else 32
        lo, hi = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        # (small values mostly: token ids in the vocabulary, counts in range)
        base = st.one_of(st.integers(max(lo, -3), min(hi, 300)), st.integers(lo, hi))
    near = _NEAR_VALID.get(field.name)
    return st.one_of(st.sampled_from(near), base) if near else base


@st.composite
def messages(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0, sparse: bool = False) -> Message:
    """One message of ``descriptor``: each field set or not (``sparse``: one in eight), a oneof's
    one member at most."""
    msg = GetMessageClass(descriptor)()
    chosen = {o.name: draw(st.sampled_from([None, *o.fields])) for o in descriptor.oneofs if not o.name.startswith("_")}
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and not oneof.name.startswith("_"):  # (a "_name" oneof is proto3's optional)
            if chosen[oneof.name] is not field:
                continue
        elif not (draw(st.integers(0, 7)) == 0 if sparse else draw(st.booleans())):
            continue
        _set(draw, msg, field, depth, sparse)
    return msg


@st.composite
def generate_requests(draw: st.DrawFn) -> pb.GenerateRequest:
    """Anything, or (as often) a valid request with a few fields changed: most arbitrary requests
    are refused at the first check, and the engine must see the near-valid ones."""
    if draw(st.booleans()):
        return draw(messages(pb.GenerateRequest.DESCRIPTOR))
    msg = pb.GenerateRequest(text="hello there", sampling=pb.SamplingParameters(max_tokens=4))
    changes = draw(messages(pb.GenerateRequest.DESCRIPTOR, sparse=True))
    msg.MergeFrom(changes)
    return msg


def _set(draw: st.DrawFn, msg: Message, field: FieldDescriptor, depth: int, sparse: bool = False) -> None:
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    if is_message and field.message_type.GetOptions().map_entry:
        key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        for k, v in draw(st.dictionaries(_scalar(key_f), _scalar(value_f), max_size=3)).items():
            getattr(msg, field.name)[k] = v
        return
    if is_message and depth >= MAX_DEPTH:
        return
    if field.is_repeated:
        count = draw(st.integers(0, 3))
        for _ in range(count):
            if is_message:
                getattr(msg, field.name).add().CopyFrom(draw(messages(field.message_type, depth + 1, sparse)))
            else:
                getattr(msg, field.name).append(draw(_scalar(field)))
    elif is_message:
        getattr(msg, field.name).CopyFrom(draw(messages(field.message_type, depth + 1, sparse)))
    else:
        setattr(msg, field.name, draw(_scalar(field)))


@pytest.fixture(scope="module")
def served(tiny_model_dir) -> Iterator[tuple[pb_grpc.GenerationStub, grpc.Channel]]:
    router, dispatcher = make_engine_router(tiny_model_dir)
    srv = ServerThread(router)  # type: ignore[arg-type]  # (a real Router, not the fake)
    srv.run(router.start())
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    try:
        yield pb_grpc.GenerationStub(channel), channel
    finally:
        channel.close()
        srv.run(router.stop(), timeout=30)
        srv.close()
        dispatcher.stop()


def check_status(err: grpc.RpcError, names_field: bool = True) -> None:
    """``names_field``: an INVALID_ARGUMENT must name its field (not for bytes that are no message)."""
    code = err.code()
    assert code not in NEVER, f"{code}: {err.details()}"
    assert err.details(), f"{code} without details"
    if code == grpc.StatusCode.INVALID_ARGUMENT and names_field:
        trailers = dict(err.trailing_metadata() or ())
        param = trailers.get("baton-error-param")
        assert param, f"INVALID_ARGUMENT naming no field: {err.details()!r}"
        assert err.details().startswith(f"{param}:"), (param, err.details())


OUTCOMES: list[str] = []  # "OK" or "<code> <details>" per generated request, for the check below


@FUZZ
@given(request=generate_requests())
def test_generate(served, request: pb.GenerateRequest) -> None:
    stub, _ = served
    finished: dict[int, int] = {}
    try:
        for msg in stub.Generate(request, timeout=60):
            assert msg.index not in finished, "a message after its choice finished"
            if msg.finished:
                assert msg.finish_reason in FINISH_REASONS, msg.finish_reason
                finished[msg.index] = 1
    except grpc.RpcError as err:
        check_status(err)
        OUTCOMES.append(f"{err.code().name} {err.details()[:60]}")
        return
    n = request.n if request.HasField("n") else 1
    assert sorted(finished) == list(range(n)), finished
    OUTCOMES.append("OK")


def test_the_generate_fuzzing_reached_the_engine() -> None:
    print("Generate outcomes:", Counter(o.split(":")[0] for o in OUTCOMES).most_common())  # (-s)
    assert "OK" in OUTCOMES and any(f.startswith("INVALID_ARGUMENT") for f in OUTCOMES), OUTCOMES


@FUZZ
@given(request=messages(pb.AbortRequest.DESCRIPTOR))
def test_abort(served, request: pb.AbortRequest) -> None:
    stub, _ = served
    try:
        assert stub.Abort(request, timeout=10).aborted is False  # nothing of this tenant runs
    except grpc.RpcError as err:
        check_status(err)


@FUZZ
@given(method=st.sampled_from(["Generate", "Abort", "GetModelInfo"]), raw=st.binary(max_size=64))
def test_bytes_that_may_be_no_message(served, method: str, raw: bytes) -> None:
    _, channel = served
    path = f"/baton.v1.Generation/{method}"
    unary = channel.unary_stream if method == "Generate" else channel.unary_unary
    call = unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        result = call(raw, timeout=60)
        if method == "Generate":
            list(result)
    except grpc.RpcError as err:
        check_status(err, names_field=err.details().startswith(UNPARSED) is False)


def test_the_server_still_serves_after_the_fuzzing(served) -> None:
    stub, _ = served
    req = pb.GenerateRequest(text="hello", sampling=pb.SamplingParameters(max_tokens=3, temperature=0))
    out = list(stub.Generate(req, timeout=30))
    assert out[-1].finished and out[-1].usage.completion_tokens == 3
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).max_model_len > 0
