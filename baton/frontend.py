"""``RouterFrontend``: one router replica's serving side — the ``Router`` (lanes, admission,
dispatch, Redis state) with its OpenAI HTTP and gRPC servers on the running event loop.

``baton up`` runs one in its own process; ``baton cluster`` runs one inside each router replica
actor. Both build it from the same ``BatonConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from baton.config import BatonConfig
from router.cluster_state import ClusterState
from router.dispatcher import Dispatcher
from router.grpc_server import GrpcServer
from router.http.app import create_app
from router.http.server import HttpServer
from router.router import Router, RouterConfig
from router.state.connection import RedisState
from router.tracing import Tracing


@dataclass(frozen=True)
class Endpoints:
    http_url: str
    grpc_target: str
    redis_url: str


def served_name(cfg: BatonConfig) -> str:
    if cfg.model.served_name:
        return cfg.model.served_name
    path = cfg.model.path
    return "SmolLM2-135M-Instruct" if path == "default" else path.rstrip("/").rsplit("/", 1)[-1]


def with_password(url: str, password: str | None) -> str:
    """``url`` (``redis://``, ``rediss://`` or ``unix://``) with ``password`` (percent-quoted) in its
    userinfo, unless the URL already carries a password there or as ``?password=``:
    ``redis://host:6379/0`` -> ``redis://:PW@host:6379/0``; a username is kept,
    ``redis://user@host:6379/0`` -> ``redis://user:PW@host:6379/0``;
    ``unix:///run/redis.sock`` -> ``unix://:PW@/run/redis.sock`` (as redis-py parses it)."""
    if not password:
        return url
    from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

    parts = urlsplit(url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    username, _, existing = userinfo.partition(":")
    if existing or "password" in parse_qs(parts.query):
        return url
    return urlunsplit(parts._replace(netloc=f"{username}:{quote(password, safe='')}@{hostport}"))


class RouterFrontend:
    def __init__(
        self,
        cfg: BatonConfig,
        dispatcher: Dispatcher,
        model_dir: Path,
        redis_url: str,
        *,
        job_idle_ms: int = 15_000,
        advertise_host: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.policy = cfg.lane_policy()  # resolves secrets: a missing key fails before anything binds
        self.dispatcher = dispatcher
        self.model_dir = model_dir
        self.redis_url = redis_url
        self.job_idle_ms = job_idle_ms
        self.advertise_host = advertise_host  # the address clients reach when binding 0.0.0.0
        self.router: Router | None = None
        self.http: HttpServer | None = None
        self.grpc: GrpcServer | None = None
        self.endpoints: Endpoints | None = None

    async def start(self, http_port: int | None = None, grpc_port: int | None = None) -> Endpoints:
        rc = self.cfg.router
        name = served_name(self.cfg)
        state = ClusterState(
            self.dispatcher.router_id,
            RedisState(self.redis_url, self.cfg.redis.cluster_name),
            job_idle_ms=self.job_idle_ms,
        )
        self.router = Router(
            RouterConfig(
                model_name=name,
                model_dir=self.model_dir,
                lanes=self.policy,
                slo_rejection=rc.slo_rejection,
                slo_headroom=rc.slo_headroom,
                pace_headroom=rc.pace_headroom,
                pace_guard=rc.pace_guard,
                lane_priority=rc.lane_priority,
                tenant_cache_isolation=rc.tenant_cache_isolation,
                initial_prefill_tokens_per_s=rc.initial_prefill_tokens_per_s,
                drain_timeout_s=rc.drain_timeout_s,
                transfer_timeout_s=self.cfg.pools.transfer_timeout_s,
            ),
            self.dispatcher.pool,
            self.dispatcher,
            state,
            Tracing.from_settings(
                self.cfg.observability.otlp_endpoint,
                self.cfg.observability.service_name,
                self.cfg.observability.sample_ratio,
            ),
        )
        await self.router.start()
        try:
            self.http = HttpServer(
                create_app(self.router, served_model_name=name, tool_format=rc.tool_call_format.tool_format),
                rc.host,
                rc.http_port if http_port is None else http_port,
            )
            await self.http.start()
            self.grpc = GrpcServer(
                self.router,
                rc.host,
                rc.grpc_port if grpc_port is None else grpc_port,
                tool_format=rc.tool_call_format.tool_format,
            )
            bound_grpc = await self.grpc.start()
        except BaseException:
            await self.stop(drain=False)
            raise
        host = self.advertise_host or rc.host
        host = f"[{host}]" if ":" in host else host  # an IPv6 address, as URLs write it
        self.endpoints = Endpoints(f"http://{host}:{self.http.port}", f"{host}:{bound_grpc}", self.redis_url)
        return self.endpoints

    async def drain(self) -> int:
        """Stop admitting (503 + Retry-After, /ready 503), let in-flight requests finish for up to
        ``router.drain_timeout_s``; return how many had to be aborted."""
        return await self.router.drain() if self.router is not None else 0

    async def stop(self, drain: bool = True) -> int:
        aborted = await self.drain() if drain else 0
        if self.http is not None:
            await self.http.stop()
        if self.grpc is not None:
            await self.grpc.stop(grace=5.0 if drain else 0)
        if self.router is not None:
            await self.router.stop()
        return aborted
