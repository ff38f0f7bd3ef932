"""Fixtures of the HTTP frontend tests: the real app on loopback in front of a FakeRouter, or (for
the fuzzing and conformance tests) in front of a real router and engine over the tiny model."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import openai
import pytest

from router.http.app import create_app
from router.http.server import ThreadedHttpServer
from tests.router.fake_router import FakeRouter
from tests.router.http.engine_stack import MODEL_NAME, make_engine_router

MODEL = "baton-test"
ENGINE_DEFAULT_MAX_TOKENS = 8  # a chat request that bounds nothing gets a short answer (a deployment may say so)


@pytest.fixture
def serve() -> Iterator[Callable[[FakeRouter], str]]:
    """Starts the app in front of a FakeRouter on 127.0.0.1 (a free port); returns the base URL."""
    servers: list[ThreadedHttpServer] = []

    def start(fake: FakeRouter) -> str:
        srv = ThreadedHttpServer(create_app(fake, served_model_name=MODEL), "127.0.0.1", 0).start()
        servers.append(srv)
        return srv.url

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture
def fake() -> FakeRouter:
    return FakeRouter()


@pytest.fixture
def url(serve, fake) -> str:
    return serve(fake)


@pytest.fixture
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0, timeout=10)


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir) -> Iterator[str]:
    """The app on loopback in front of a real router and engine (tests/router/http/engine_stack.py)."""
    router, dispatcher = make_engine_router(tiny_model_dir)
    app = create_app(router, served_model_name=MODEL_NAME, default_max_tokens=ENGINE_DEFAULT_MAX_TOKENS)
    server = ThreadedHttpServer(app).start()
    server.call(router.start())
    try:
        yield server.url
    finally:
        server.call(router.stop(), timeout_s=30)
        server.stop()
        dispatcher.stop()
