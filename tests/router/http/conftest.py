"""Fixtures of the HTTP frontend tests: the real app on loopback in front of a FakeRouter."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import openai
import pytest

from router.http.app import create_app
from router.http.server import ThreadedHttpServer
from tests.router.fake_router import FakeRouter

MODEL = "baton-test"


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
