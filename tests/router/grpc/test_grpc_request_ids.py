"""A gRPC ``request_id`` follows the HTTP frontend's ``X-Request-Id`` rule (1-128 of
``[A-Za-z0-9._-]``): it reaches logs and names durable batch jobs that ``GET /v1/batches/{id}``
must be able to name."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc
from router.http.app import create_app
from router.http.server import ThreadedHttpServer
from tests.router.fake_router import FakeRouter
from tests.router.grpc.test_grpc_api import ServerThread, rpc_error, text_req

# A newline forges log lines; '/', ':', '%' and ',' cannot be named by a URL path segment (or
# split the X-Request-Id list of n > 1 choices); anything non-ASCII, NUL or a space; too long.
BAD_IDS = ["a\nb", "x/y:z%", "a,b", "é" * 10, "\x00", " ", "r" * 129]


@pytest.fixture
def fake() -> FakeRouter:
    return FakeRouter(max_model_len=1000)


@pytest.fixture
def stub(fake: FakeRouter) -> Iterator[pb_grpc.GenerationStub]:
    srv = ServerThread(fake)
    ch = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    try:
        yield pb_grpc.GenerationStub(ch)
    finally:
        ch.close()
        srv.close()


@pytest.mark.parametrize("rid", BAD_IDS)
def test_a_request_id_outside_the_rule_is_invalid_argument(stub, fake, rid):
    for lane in ("interactive", "batch"):
        err = rpc_error(lambda: list(stub.Generate(text_req(request_id=rid, lane=lane), timeout=10)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith("request_id: "), err.details()
        assert dict(err.trailing_metadata())["baton-error-code"] == "invalid_request_id"
    assert fake.requests == []


def test_a_request_id_within_the_rule_is_kept(stub, fake):
    rid = ("Ab9._-" * 22)[:128]
    msgs = list(stub.Generate(text_req(request_id=rid), timeout=10))
    assert msgs[-1].request_id == rid and fake.requests[0].request_id == rid


@pytest.mark.parametrize("rid", [r for r in BAD_IDS if r.isascii() and r.isprintable() and r.strip() == r])
def test_http_refuses_the_same_ids(fake, rid):
    with ThreadedHttpServer(create_app(fake, served_model_name="m")) as srv:
        r = httpx.post(
            srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers={"X-Request-Id": rid}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Id"
